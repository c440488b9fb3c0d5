"""What tools and servers see of a session's background processes (issue 32): the types, the
errors and the ``ProcessControl`` a sandbox declares (``Sandbox.processes``).

This module only states the contract. The container sandboxes implement it with their in-sandbox
agent's process table (``dispatcher/sandbox/agent/table.py``; ``docs/agent-processes.md``), the
fake sandbox of the unit tests in memory; ``core`` never imports those implementations.

A process is named by ``process_id``: chosen by the server (``p_…``) or by its caller. Starting
the same id with the same command again answers the existing record (a retried call starts one
process); with another command it is a ``conflict``. Its output, stdout and stderr, is counted on
one monotonic cursor per process and kept in a bounded ring: a read from a cursor that fell out
of the ring says how many bytes it ``lost``, never a silent gap.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from dispatcher.core.errors import FailureReason, ToolExecutionError

ProcessState = Literal["running", "exited", "killed"]
"""``killed``: it ended after a stop or a signal the table sent it."""
Stream = Literal["stdout", "stderr"]
Origin = Literal["background", "left"]
"""How it entered the table: started in the background, or left running by a foreground command."""
PROCESS_SIGNALS = ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2")

PROCESS_ERROR_CODES = frozenset(
    {"no_process", "conflict", "too_many", "too_large", "not_running", "unsupported"}
)


class ProcessError(ToolExecutionError):
    """A process operation was refused; nothing was done. ``code``:

    - ``no_process``: no process of this session has that id (or it was forgotten);
    - ``conflict``: the id names a process with another command;
    - ``too_many``: the session's running-process bound is reached;
    - ``too_large``: a ring or stdin bound would be exceeded;
    - ``not_running``: stdin of a process that ended or whose stdin was closed;
    - ``unsupported``: this sandbox has no process table (the message says why).

    The message says what happened and what to do, for the model to read.
    """

    def __init__(self, code: str, message: str, **kw: object) -> None:
        if code in ("too_many", "too_large"):
            kw.setdefault("reason", FailureReason.QUOTA)
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.code = code


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """One process of a session. ``end``: the cursor after its newest output byte; ``first``: the
    oldest one its ring still holds. Once it ended, exactly one of ``exit_code`` and ``signal``,
    except for a group a foreground command left running (its leader was that command's shell,
    not the table's child): neither."""

    process_id: str
    command: str
    cwd: str
    """Workspace-relative."""
    pid: int
    """Its process group, as the sandbox sees it."""
    state: ProcessState
    exit_code: int | None
    signal: int | None
    started: float
    """Epoch seconds."""
    ended: float | None
    tool_use_id: str | None
    """The call that started it (or left it running)."""
    end: int
    first: int
    ring_bytes: int
    stdin_open: bool
    origin: Origin

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """Output of one stream from ``cursor`` on; ``lost``: bytes before it that the ring dropped
    before they could be read (only a watch's chunks carry it; a read's is ``ProcessOutput.lost``)."""

    stream: Stream
    cursor: int
    data: bytes
    lost: int = 0


@dataclass(frozen=True, slots=True)
class ProcessOutput:
    """A read's answer: ``chunks`` in order and contiguous, ``next`` the cursor to read from next,
    ``lost`` the bytes between the cursor asked and the first returned that the ring no longer
    held; and the process's state at the time of the answer."""

    chunks: tuple[OutputChunk, ...]
    next: int
    lost: int
    state: ProcessState
    exit_code: int | None
    signal: int | None


@dataclass(frozen=True, slots=True)
class ProcessStart:
    """Start ``sh -c command`` in the background, in its own process group, stdin on a pipe."""

    process_id: str
    command: str
    cwd: str = "."
    approved_cwd: str | None = None
    """As ``ExecRequest.approved_cwd``: the cwd as resolved when the call was approved."""
    env: Mapping[str, str] = field(default_factory=dict)
    tool_use_id: str | None = None
    ring_bytes: int | None = None
    """Its output ring (None: the sandbox's default)."""


@dataclass(frozen=True, slots=True)
class ShellState:
    """Where a foreground ``shell`` command ended (``ExecRequest.capture_state``): the working
    directory (workspace-relative; None: outside the workspace or unknown), the exported variables
    it changed or added, and those it removed. What the next command of the session starts with
    when ``tools.shell.persist`` is on."""

    cwd: str | None
    env: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()


CodeLanguage = Literal["python", "javascript"]
CODE_LANGUAGES: tuple[CodeLanguage, ...] = ("python", "javascript")


@dataclass(frozen=True, slots=True)
class CodeContext:
    """A live interpreter of ``run_code`` (``tools/code/contexts.py``): a running worker process
    of the session's table, named by its language and context; ``generation`` counts its
    restarts (its process id is ``code:<language>:<name>:<generation>``)."""

    language: CodeLanguage
    name: str
    generation: int
    info: ProcessInfo

    @property
    def process_id(self) -> str:
        return self.info.process_id


class ProcessControl(Protocol):
    """One session's process table. Every method raises ``ProcessError`` for a refusal and
    ``SandboxError`` when the sandbox itself failed."""

    async def start(self, request: ProcessStart) -> ProcessInfo:
        """Start it (or answer the record of the same id and command)."""
        ...

    async def list(self) -> tuple[ProcessInfo, ...]:
        """Every process, running and the finished ones kept, oldest first."""
        ...

    async def read(
        self, process_id: str, *, after: int = 0, wait_seconds: float = 0.0, max_bytes: int = 64 * 1024
    ) -> ProcessOutput:
        """The output after cursor ``after``, at most ``max_bytes``; with ``wait_seconds``, waits
        that long at most for some (or for the end) when there is none yet."""
        ...

    def watch(self, process_id: str, *, after: int = 0) -> AsyncIterator[OutputChunk | ProcessInfo]:
        """Follow its output from ``after`` as it comes; the last item is the record once it
        ended and every byte went out. Closing the iterator early stops the watch."""
        ...

    async def wait(self, process_id: str) -> ProcessInfo:
        """Its record once it has ended (for ``process.exited``); cancellable."""
        ...

    async def write_input(self, process_id: str, data: bytes, *, close: bool = False) -> ProcessInfo:
        """Bytes for its stdin (buffered up to the sandbox's bound), and/or close it."""
        ...

    async def signal(
        self, process_id: str, signal: str, *, grace_seconds: float | None = None
    ) -> ProcessInfo:
        """``signal`` (one of ``PROCESS_SIGNALS``) to its whole process group; with
        ``grace_seconds``, ``KILL`` follows if the group outlives it, and the answer comes once
        the group is empty."""
        ...


class SessionProcesses(Protocol):
    """What a session remembers between its calls of its processes and of its shell
    (``ToolContext.processes``; kept with the session in ``core/sessions/processes.py``, stored so
    that a server restart keeps it). Tools read and change it; nothing here runs anything."""

    def shell_start(self) -> tuple[str | None, Mapping[str, str]]:
        """Where the session's next ``shell`` command starts: the directory the last one ended in
        (workspace-relative; None: the root) and the exported variables it left."""
        ...

    def shell_ended(self, state: ShellState | None) -> str | None:
        """Remember where a command's shell ended (None: it could not tell; what was known stays).
        Returns a note for the model when something could not be remembered."""
        ...

    def shell_reset(self, *, cwd_only: bool = False) -> None:
        """Forget the directory and the variables: the next command starts at the root with the
        image's environment. ``cwd_only``: forget the directory alone (it is gone)."""
        ...

    def last_read(self, process_id: str) -> int:
        """The cursor after what this session's model last read of the process (0: nothing yet)."""
        ...

    def read_to(self, process_id: str, cursor: int) -> None:
        """The model has read the process's output up to ``cursor``."""
        ...

    def started(self, info: ProcessInfo, control: ProcessControl, tool_use_id: str | None = None) -> None:
        """A call of this session started the process (or a command left it running): announce
        it (``process.started``) and announce its end when it comes (``process.exited``), both
        with ``tool_use_id`` (None: the one the record names)."""
        ...
