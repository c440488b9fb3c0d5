"""The fake sandbox's process table: ``ProcessControl`` in memory, for unit tests of the core.

Nothing runs. A test drives each process: ``output(pid, "stdout", b"..")`` is what it printed,
``exit(pid, code)`` its end, ``consume(pid)`` what it read of its stdin; ``ignore(pid, "TERM")``
makes a signal do nothing (a stop then needs its ``KILL``). Everything else is the contract's
(``core/process_api.py``) and the agent's (``sandbox/agent/table.py``, ``docs/agent-processes.md``):
the same ids and retry-safe starts, a ring of the newest bytes on one cursor over both streams
with its ``lost`` count, the same bounds (``Limits``, the agent's defaults) and error codes,
finished processes kept readable up to their bound, and a signal that ends a process making it
``killed``. (Host code imports nothing of the agent but its protocol, so the ring is this one.)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import signal as signals
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from dispatcher.core.process_api import (
    PROCESS_SIGNALS,
    Origin,
    OutputChunk,
    ProcessError,
    ProcessInfo,
    ProcessOutput,
    ProcessStart,
    ProcessState,
    Stream,
)

__all__ = ["FakeProcess", "FakeProcesses", "Limits", "Ring"]


@dataclass(frozen=True)
class Limits:
    """The table's bounds; the agent's defaults (``docs/agent-processes.md``)."""

    running: int = 32
    ring_bytes: int = 1 << 20
    max_ring_bytes: int = 16 << 20
    total_ring_bytes: int = 64 << 20
    finished: int = 64
    stdin_bytes: int = 1 << 20


class Ring:
    """The newest ``capacity`` bytes of both streams, each byte at its place on one cursor."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pieces: deque[tuple[str, int, bytes]] = deque()  # (stream, cursor, bytes)
        self.first = 0
        self.end = 0

    def append(self, stream: str, data: bytes) -> None:
        self._pieces.append((stream, self.end, data))
        self.end += len(data)
        while self._pieces and self.end - self._pieces[0][1] > self.capacity:
            stream0, cursor, piece = self._pieces.popleft()
            excess = self.end - cursor - self.capacity
            if excess < len(piece):
                self._pieces.appendleft((stream0, cursor + excess, piece[excess:]))
        self.first = self._pieces[0][1] if self._pieces else self.end

    def read(self, after: int, max_bytes: int) -> tuple[list[tuple[str, int, bytes]], int, int]:
        """(pieces, next cursor, bytes lost between ``after`` and the first returned)."""
        after = min(max(after, 0), self.end)
        lost = max(self.first - after, 0)
        position = max(after, self.first)
        out: list[tuple[str, int, bytes]] = []
        for stream, cursor, data in self._pieces:
            budget = max_bytes - sum(len(p[2]) for p in out)
            if budget <= 0:
                break
            if cursor + len(data) <= position:
                continue
            piece = data[position - cursor : position - cursor + budget]
            out.append((stream, position, piece))
            position += len(piece)
        return out, position, lost


ENDING = frozenset({"TERM", "KILL", "INT", "HUP", "QUIT"})
"""Signals that end a process (unless the test made it ignore them), as ``killed``."""
WATCH_CHUNK = 64 * 1024
_pids = itertools.count(1000)


@dataclass(eq=False)
class FakeProcess:
    """One process of the fake table."""

    process_id: str
    command: str
    cwd: str
    tool_use_id: str | None
    origin: Origin
    ring: Ring
    env: dict[str, str] = field(default_factory=dict)
    pid: int = field(default_factory=lambda: next(_pids))
    state: ProcessState = "running"
    exit_code: int | None = None
    signal: int | None = None
    started: float = field(default_factory=time.time)
    ended: float | None = None
    stdin_open: bool = True
    pending: bytearray = field(default_factory=bytearray)
    """Bytes written to its stdin that it has not read yet (``consume``)."""
    ignored: set[str] = field(default_factory=set)
    signals: list[str] = field(default_factory=list)
    """Every signal sent to it, in order."""
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def info(self) -> ProcessInfo:
        return ProcessInfo(
            process_id=self.process_id,
            command=self.command,
            cwd=self.cwd,
            pid=self.pid,
            state=self.state,
            exit_code=self.exit_code,
            signal=self.signal,
            started=self.started,
            ended=self.ended,
            tool_use_id=self.tool_use_id,
            end=self.ring.end,
            first=self.ring.first,
            ring_bytes=self.ring.capacity,
            stdin_open=self.stdin_open and self.state == "running",
            origin=self.origin,
        )

    async def notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()


def _moved(proc: FakeProcess, position: int) -> bool:
    return proc.ring.end > position or proc.state != "running"


class FakeProcesses:
    """Implements ``dispatcher.core.process_api.ProcessControl`` in memory."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.check_cwd: Callable[[str], None] = lambda cwd: None
        """Refuses a start's cwd as the sandbox would (``FakeSandbox`` sets its own check)."""
        self.procs: dict[str, FakeProcess] = {}  # in start order
        self.starts: list[ProcessStart] = []
        """Every start asked, retried ones included."""

    # -- what a test drives --------------------------------------------------------------------

    def get(self, process_id: str) -> FakeProcess:
        """The process (a test's access to its record, stdin and signals)."""
        return self._get(process_id)

    async def output(self, process_id: str, stream: Stream, data: bytes) -> None:
        """The process printed ``data`` on ``stream``."""
        proc = self._get(process_id)
        assert proc.state == "running", f"{process_id} has ended: it prints nothing more"
        proc.ring.append(stream, data)
        await proc.notify()

    async def exit(self, process_id: str, code: int | None = 0, *, signal: int | None = None) -> None:
        """The process ended by itself: with ``code``, or killed by ``signal`` it did not get from us."""
        await self._end(self._get(process_id), "exited", None if signal is not None else code, signal)

    def consume(self, process_id: str) -> bytes:
        """What the process reads of its stdin now (the buffer empties)."""
        proc = self._get(process_id)
        data, proc.pending = bytes(proc.pending), bytearray()
        return data

    def ignore(self, process_id: str, *names: str) -> None:
        """The process survives these signals (a stop must then kill it)."""
        self._get(process_id).ignored.update(names)

    def adopt(self, process_id: str, command: str, cwd: str, tool_use_id: str | None) -> ProcessInfo | None:
        """What a foreground exec left running becomes a process of the table (``origin: left``),
        as the agent does with ``leave_as``; None when the table is full (nothing is taken)."""
        if process_id in self.procs:
            return None
        try:
            proc = self._reserve(process_id, command, cwd, None, tool_use_id, "left")
        except ProcessError:
            return None
        proc.stdin_open = False  # its stdin was the exec's
        return proc.info()

    async def kill_all(self) -> None:
        """The session closes: every running process is killed."""
        for proc in list(self.procs.values()):
            if proc.state == "running":
                proc.signals.append("KILL")
                await self._end(proc, "killed", None, signals.SIGKILL)

    # -- ProcessControl ------------------------------------------------------------------------

    async def start(self, request: ProcessStart) -> ProcessInfo:
        self.starts.append(request)
        known = self.procs.get(request.process_id)
        if known is not None:
            if known.command != request.command:
                raise ProcessError(
                    "conflict", f"process {request.process_id} exists and runs another command"
                )
            return known.info()
        if request.approved_cwd is None:
            self.check_cwd(request.cwd)
        proc = self._reserve(
            request.process_id,
            request.command,
            request.approved_cwd or request.cwd,
            request.ring_bytes,
            request.tool_use_id,
            "background",
        )
        proc.env = dict(request.env)
        return proc.info()

    async def list(self) -> tuple[ProcessInfo, ...]:
        return tuple(p.info() for p in self.procs.values())

    async def read(
        self, process_id: str, *, after: int = 0, wait_seconds: float = 0.0, max_bytes: int = 64 * 1024
    ) -> ProcessOutput:
        proc = self._get(process_id)
        if max_bytes < 1 or wait_seconds < 0:
            raise ValueError("max_bytes must be positive and wait_seconds not negative")
        pieces, next_cursor, lost = proc.ring.read(after, max_bytes)
        if not pieces and not lost and proc.state == "running" and wait_seconds > 0:
            async with proc.changed:
                try:
                    async with asyncio.timeout(wait_seconds):
                        await proc.changed.wait_for(lambda: proc.ring.end > after or proc.state != "running")
                except TimeoutError:
                    pass
            pieces, next_cursor, lost = proc.ring.read(after, max_bytes)
        chunks = tuple(OutputChunk(stream, cursor, data) for stream, cursor, data in pieces)  # type: ignore[arg-type]
        return ProcessOutput(chunks, next_cursor, lost, proc.state, proc.exit_code, proc.signal)

    async def watch(self, process_id: str, *, after: int = 0) -> AsyncIterator[OutputChunk | ProcessInfo]:
        proc = self._get(process_id)
        position = after
        while True:
            pieces, position, lost = proc.ring.read(position, WATCH_CHUNK)
            for stream, cursor, data in pieces:
                yield OutputChunk(stream, cursor, data, lost)  # type: ignore[arg-type]
                lost = 0
            if pieces:
                continue
            if proc.state != "running" and position >= proc.ring.end:
                yield proc.info()
                return
            async with proc.changed:
                await proc.changed.wait_for(functools.partial(_moved, proc, position))

    async def wait(self, process_id: str) -> ProcessInfo:
        proc = self._get(process_id)
        async with proc.changed:
            await proc.changed.wait_for(lambda: proc.state != "running")
        return proc.info()

    async def write_input(self, process_id: str, data: bytes, *, close: bool = False) -> ProcessInfo:
        proc = self._get(process_id)
        if proc.state != "running" or not proc.stdin_open:
            raise ProcessError("not_running", f"process {process_id} takes no more input")
        if len(proc.pending) + len(data) > self.limits.stdin_bytes:
            raise ProcessError(
                "too_large",
                f"process {process_id} has {len(proc.pending)} bytes of input it has not read;"
                f" {len(data)} more would pass {self.limits.stdin_bytes}",
            )
        proc.pending += data
        if close:
            proc.stdin_open = False
        return proc.info()

    async def signal(
        self, process_id: str, signal: str, *, grace_seconds: float | None = None
    ) -> ProcessInfo:
        if signal not in PROCESS_SIGNALS:
            raise ValueError(f"unknown signal {signal!r}")
        proc = self._get(process_id)
        if proc.state != "running":
            return proc.info()
        proc.signals.append(signal)
        if signal in ENDING and signal not in proc.ignored:
            await self._end(proc, "killed", None, signals.Signals[f"SIG{signal}"].value)
            return proc.info()
        if grace_seconds is None:
            return proc.info()
        try:
            await asyncio.wait_for(self.wait(process_id), grace_seconds)
        except TimeoutError:
            proc.signals.append("KILL")
            await self._end(proc, "killed", None, signals.SIGKILL.value)
        return proc.info()

    # -- the table -----------------------------------------------------------------------------

    def _get(self, process_id: str) -> FakeProcess:
        proc = self.procs.get(process_id)
        if proc is None:
            raise ProcessError("no_process", f"no process {process_id} in this session")
        return proc

    def _reserve(
        self,
        process_id: str,
        command: str,
        cwd: str,
        ring_bytes: int | None,
        tool_use_id: str | None,
        origin: Origin,
    ) -> FakeProcess:
        limits = self.limits
        running = sum(1 for p in self.procs.values() if p.state == "running")
        if running >= limits.running:
            raise ProcessError("too_many", f"{running} processes are running, the most a session may run")
        ring = limits.ring_bytes if ring_bytes is None else ring_bytes
        if ring > limits.max_ring_bytes:
            raise ProcessError(
                "too_large", f"an output ring of {ring} bytes is more than {limits.max_ring_bytes}"
            )
        while self._ring_total() + ring > limits.total_ring_bytes and self._forget_oldest():
            pass
        if self._ring_total() + ring > limits.total_ring_bytes:
            raise ProcessError(
                "too_large",
                f"the session's output rings would pass {limits.total_ring_bytes} bytes; stop a process",
            )
        proc = FakeProcess(process_id, command, cwd, tool_use_id, origin, Ring(ring))
        self.procs[process_id] = proc
        return proc

    def _ring_total(self) -> int:
        return sum(p.ring.capacity for p in self.procs.values())

    def _forget_oldest(self) -> bool:
        for key, proc in self.procs.items():
            if proc.state != "running":
                del self.procs[key]
                return True
        return False

    async def _end(
        self, proc: FakeProcess, state: ProcessState, code: int | None, signal: int | None
    ) -> None:
        assert proc.state == "running", f"{proc.process_id} has ended already"
        proc.state, proc.exit_code, proc.signal = state, code, signal
        proc.ended = time.time()
        proc.stdin_open = False
        finished = [key for key, p in self.procs.items() if p.state != "running"]
        for key in finished[: max(len(finished) - self.limits.finished, 0)]:
            del self.procs[key]
        await proc.notify()
