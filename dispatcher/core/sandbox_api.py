"""What tools see of the place they run in: the workspace file API and process execution.

This module only states the contract. ``dispatcher.sandbox`` implements it (the Docker backend
with its in-container agent, and a local backend used by unit tests); ``core`` never imports
those implementations.

Paths given to these methods are as the model wrote them: relative to ``workspace_root`` or
absolute inside it. Implementations resolve them where the files are (inside the container),
following symlinks there, and raise ``WorkspaceEscapeError`` for anything that lands outside.

``approved`` (on the methods tools use, and ``ExecRequest.approved_cwd``): what ``resolve`` said
the path was when a human approved the call. The sandbox then uses exactly that path, walked
from the root without following any link, and fails with ``FileOpError("changed")`` (nothing
done) if a link or another directory stands there now: what a human approves is what runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from dispatcher.core.errors import DispatcherError, FailureReason, ToolExecutionError
from dispatcher.core.process_api import ProcessControl, ShellState

EntryKind = Literal["file", "dir", "symlink", "other"]


class SandboxError(DispatcherError):
    """The sandbox itself failed (container gone, agent dead, protocol violation)."""


_QUOTA_CODES = frozenset({"ENOSPC", "EDQUOT"})


class FileOpError(ToolExecutionError):
    """A file operation failed for an ordinary reason; ``code`` is an errno name or slug.

    Codes: ``ENOENT``, ``EISDIR``, ``ENOTDIR``, ``EEXIST``, ``EACCES``, ``ENOTEMPTY``,
    ``too_large``, ``binary``, ``no_match``, ``multiple_matches``, ``decode``, ``changed`` (an
    approved path has a link or another directory on it now; nothing was done).
    """

    def __init__(self, code: str, message: str, **kw: object) -> None:
        if code in _QUOTA_CODES:
            kw.setdefault("reason", FailureReason.QUOTA)
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.code = code


class ProcessLimitExhausted(ToolExecutionError):
    """No process could be started: the sandbox's process (pids) limit is full."""

    default_reason = FailureReason.QUOTA

    def __init__(self, message: str, *, processes: int, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.processes = processes
        """Processes that earlier commands left running in the sandbox."""


_notices: ContextVar[list[str] | None] = ContextVar("sandbox_notices", default=None)


def report_notice(text: str) -> bool:
    """Tell the model, in the result of the call being served, what happened to its sandbox.

    For what the call did not cause but must know: the sandbox was recreated and lost its
    ``/tmp`` and processes, leftover processes were killed. Outside a call this does nothing
    and returns False.
    """
    notices = _notices.get()
    if notices is None:
        return False
    if text not in notices:
        notices.append(text)
    return True


class collect_notices:
    """Gather the notices that sandboxes report while the block (and tasks it starts) runs.

    A class rather than a generator-based context manager: every tool call enters one."""

    __slots__ = ("_token",)

    def __enter__(self) -> list[str]:
        notices: list[str] = []
        self._token = _notices.set(notices)
        return notices

    def __exit__(self, *exc_info: object) -> None:
        _notices.reset(self._token)


@dataclass(frozen=True, slots=True)
class DirEntry:
    name: str
    kind: EntryKind
    size: int = 0
    target: str | None = None  # symlink target, as stored
    staged: bool = False  # review/audit: a staged change, not on disk yet (core/staging/files.py)


@dataclass(frozen=True, slots=True)
class FileStat:
    path: str  # resolved, inside workspace_root
    kind: EntryKind
    size: int
    mode: int
    mtime: float


@dataclass(frozen=True, slots=True)
class DirListing:
    entries: tuple[DirEntry, ...]
    truncated: bool  # more entries existed than the limit


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One command: run as ``sh -c command`` in its own process group."""

    command: str
    timeout: float
    cwd: str = "."  # relative to workspace_root
    approved_cwd: str | None = None  # see the module docstring: cwd as resolved and approved
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bytes | None = None
    grace_seconds: float = 3.0  # between SIGTERM and SIGKILL
    tool_use_id: str | None = None
    """The call running it: the egress proxy's questions about connections its processes open
    land on that call, and its cancel closes their tunnels."""
    leave_as: str | None = None
    """The process id to give what the command leaves running while holding its output (``cmd &``):
    the sandbox keeps reading it as a process of the session (``ExecResult.left``). None: the
    sandbox picks one (``p_…``)."""
    capture_state: bool = False
    """Report where the command's shell ended (``ExecResult.shell_state``): its directory and
    exported variables, captured apart from its output."""


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int | None  # None when killed by a signal
    signal: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    killed: bool = False  # SIGKILL (or container stop) was needed
    duration_ms: float = 0.0
    left: tuple[str, ...] = ()
    """Ids of the processes the command left running, now the session's (``ProcessControl``)."""
    shell_state: ShellState | None = None
    """With ``capture_state``: where its shell ended; None when it could not tell (``exec prog``,
    a fatal signal, the command's own ``EXIT`` trap): keep what was known."""


OutputCallback = Callable[[Literal["stdout", "stderr"], bytes], "asyncio.Future[None] | None"]
"""A command's output as it comes. A future back: whoever reads it is full; the sandbox reads no
more of the command's output until it is done (or the command is being stopped), so the command
slows down instead of its output being lost (``OutputSink``)."""


PortErrorCode = Literal["bad_port", "refused", "unsupported", "too_many"]


class PortError(DispatcherError):
    """A connection to a port of the sandbox could not be made. ``code``: ``bad_port`` (not in
    1-65535), ``refused`` (nothing listens there, or the sandbox answered with an error),
    ``unsupported`` (this sandbox has no way in), ``too_many`` (its bound on open connections)."""

    def __init__(self, code: PortErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: PortErrorCode = code


def check_port(port: int) -> int:
    """``port`` if it names a TCP port (1-65535).

    Raises:
        PortError: ``bad_port``.
    """
    if type(port) is not int or not 0 < port <= 65535:
        raise PortError("bad_port", f"port {port!r} is not a TCP port (1-65535)")
    return port


class PortStream(Protocol):
    """One TCP connection to ``127.0.0.1:port`` inside a sandbox, as a byte stream both ways.

    Each direction holds at most a bounded window in flight: ``write`` waits while the sandbox's
    side does not read, and the sandbox's side waits while nobody calls ``read``."""

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; ``b""`` once the sandbox's side half-closed (or the connection is gone)."""
        ...

    async def write(self, data: bytes) -> None:
        """Send all of ``data``, waiting for the window.

        Raises:
            ConnectionResetError: the sandbox's side is gone, or ``shut_write``/``close`` ran.
        """
        ...

    async def shut_write(self) -> None:
        """Half-close: the sandbox's side reads its end once what was written is delivered; reading
        goes on."""
        ...

    async def close(self) -> None:
        """Close both ways; idempotent."""
        ...


class AttachedProcess(Protocol):
    """A long-running process with its stdin and stdout attached (an MCP server's, ``run: sandbox``):
    its stdout, its stdin, and the means to end it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    violation: str | None
    """Why the reader gave up on it (a protocol violation), once it has."""

    def stderr_tail(self) -> str:
        """The end of what it wrote to stderr, escaped (it is untrusted text)."""
        ...

    async def wait(self) -> None:
        """Return once the process has exited (or its stream is gone)."""

    async def kill(self) -> None:
        """End the process and everything it started, now."""

    async def close(self) -> None:
        """End it politely where that means something, then ``kill``."""


class WorkspaceFileAPI(Protocol):
    """Workspace-scoped file access (spec 000 §5.1), asynchronous because files live in a sandbox."""

    @property
    def workspace_root(self) -> str: ...

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes:
        """Read at most ``max_bytes`` (``too_large`` if the file is bigger and no cap was asked)."""
        ...

    async def read(self, path: str) -> str: ...

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """Atomic replace (temp file in the same directory + rename), keeping the mode; makes parents.

        ``expect_sha256`` (review mode): replace only if the file's content still hashes so
        ("absent": there is no file), checked just before the rename; else ``FileOpError`` ``changed``.
        """
        ...

    async def write(
        self, path: str, content: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None: ...

    async def append(self, path: str, content: str) -> None: ...

    async def exists(self, path: str) -> bool: ...

    async def stat(self, path: str, *, approved: str | None = None) -> FileStat: ...

    async def list(self, path: str, *, limit: int = 1000, approved: str | None = None) -> DirListing: ...

    async def delete(self, path: str) -> None: ...

    async def patch(
        self, path: str, old: str, new: str, *, approved: str | None = None, replace_all: bool = False
    ) -> int:
        """Replace the one occurrence of ``old`` with ``new``, atomically (str_replace style); with
        ``replace_all``, every occurrence. Returns how many were replaced.

        Exactly ``patch_file``'s semantics (``core/patch.py``'s ``apply_patch``): ``old`` must occur
        exactly once unless ``replace_all`` (spanning lines, it also matches the file's other line
        ending); the file is written only over the bytes it was read as.

        Raises:
            FileOpError: ``no_match``, ``multiple_matches``, ``decode``, ``changed`` (written
                meanwhile), or the read's and the write's errors; the file is then unchanged.
        """
        ...

    async def resolve(self, path: str) -> str:
        """Where ``path`` really is: normalised, relative to the workspace root ('.' for the root).

        Symlinks are followed in the sandbox as they are now; the parts that do not exist yet are
        taken as written. Names are exact (a byte that is not UTF-8 is a lone surrogate). The
        answer is what checks made before a call runs see (grants, confirmation); passed back as
        ``approved``, it is the path used. The sandbox enforces the session's grants again at use.

        Raises:
            WorkspaceEscapeError: the path resolves outside the workspace.
        """
        ...


class Sandbox(WorkspaceFileAPI, Protocol):
    """One session's sandbox: its files plus process execution."""

    async def exec(
        self,
        request: ExecRequest,
        on_output: OutputCallback,
        cancel_event: asyncio.Event,
    ) -> ExecResult:
        """Run a command, streaming its output; on timeout or ``cancel_event`` kill its process group.

        Kill sequence: SIGTERM, ``grace_seconds``, SIGKILL, then the sandbox itself is stopped
        if the group still lives. Returns normally in all of these cases (see the flags).

        Raises:
            SandboxError: the sandbox could not run the command at all.
        """
        ...

    async def start_process(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], *, limit: int
    ) -> AttachedProcess:
        """A long-running process in the sandbox (an MCP server's, ``run: sandbox``), as the
        sandbox's user in its workspace, its stdin and stdout attached, ended with the sandbox;
        ``name``: what logs call it; a line of its stdout longer than ``limit`` is a violation.

        Raises:
            SandboxError: it could not be started, or this sandbox cannot attach one (the message
                says why).
            OSError: its executable could not be started.
        """
        ...

    def agent_channel(self, what: str) -> AbstractAsyncContextManager[Any]:
        """Its agent's channel, lent for one long operation such as a tree transfer: held (the
        sandbox counts as busy) until the block ends, with no per-operation timeout. The channel is
        the sandbox layer's ``AgentChannel``, a type this layer cannot name; ``what``: the
        operation, for messages.

        Raises:
            SandboxError: this sandbox has no agent channel to lend (on entering the block).
        """
        ...

    def quota_note(self) -> str | None:
        """What to add when the workspace's disk is full (the tenant's quota), if anything."""
        ...

    async def connect_port(self, port: int) -> PortStream:
        """A new TCP connection to ``127.0.0.1:port`` inside the sandbox (never another address),
        carried over its agent's channel: no port of the sandbox is published. Close it when done.

        Raises:
            PortError: ``bad_port``, ``refused`` (nothing listens there), ``unsupported`` (this
                sandbox has no agent channel), ``too_many``.
            SandboxError: the sandbox failed.
        """
        ...

    def processes(self) -> ProcessControl:
        """The session's process table (background processes, issue 32).

        Raises:
            ProcessError: ``unsupported``, this sandbox has none (the message says why).
        """
        ...
