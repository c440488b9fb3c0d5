"""A session's process table in memory, for the RPC, client and CLI tests of background processes.

It keeps ``ProcessControl``'s contract (``core/process_api.py``) as the sandboxes' tables do: one
cursor over stdout and stderr, a bounded ring whose readers are told what they lost, finished
processes kept readable, bounds on running processes and buffered stdin, signals ending the whole
process. What a real table gets from a running command, a test gives it here: ``emit`` writes
output, ``finish`` ends the process. ``watching`` counts the open watches (a watch whose client
left must be closed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from dispatcher.core.process_api import (
    PROCESS_SIGNALS,
    OutputChunk,
    ProcessError,
    ProcessInfo,
    ProcessOutput,
    ProcessStart,
    Stream,
)
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider

SIGNAL_NUMBERS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15}
RUNNING_LIMIT = 4
STDIN_LIMIT = 1024
RING_BYTES = 256


@dataclass
class _Process:
    info: ProcessInfo
    ring: list[OutputChunk] = field(default_factory=list)
    stdin: bytearray = field(default_factory=bytearray)
    signals: list[str] = field(default_factory=list)

    @property
    def first(self) -> int:
        return self.ring[0].cursor if self.ring else self.info.end


class MemoryProcessTable:
    """One session's processes (``ProcessControl``), in memory."""

    def __init__(self, *, running_limit: int = RUNNING_LIMIT, ring_bytes: int = RING_BYTES) -> None:
        self._procs: dict[str, _Process] = {}
        self._changed = asyncio.Condition()
        self.running_limit = running_limit
        self.ring_bytes = ring_bytes
        self.watching = 0
        self.taken = 0
        """Items every watch handed out: what a reader took from the sandbox."""
        self.closed = False

    # -- what a running command would do -------------------------------------------------------

    async def emit(self, process_id: str, stream: Stream, data: bytes) -> None:
        """The process writes ``data``; the ring keeps its newest ``ring_bytes``."""
        p = self._procs[process_id]
        p.ring.append(OutputChunk(stream, p.info.end, data))
        end = p.info.end + len(data)
        while sum(len(c.data) for c in p.ring) > p.info.ring_bytes:
            oldest = p.ring[0]
            drop = min(len(oldest.data), sum(len(c.data) for c in p.ring) - p.info.ring_bytes)
            if drop == len(oldest.data):
                p.ring.pop(0)
            else:
                p.ring[0] = OutputChunk(oldest.stream, oldest.cursor + drop, oldest.data[drop:])
        p.info = _with(p.info, end=end, first=p.ring[0].cursor if p.ring else end)
        await self._notify()

    async def finish(self, process_id: str, exit_code: int | None = 0, *, signal: int | None = None) -> None:
        p = self._procs[process_id]
        state = "exited" if signal is None else "killed"
        p.info = _with(
            p.info,
            state=state,
            exit_code=exit_code if signal is None else None,
            signal=signal,
            ended=time.time(),
            stdin_open=False,
        )
        await self._notify()

    def stdin_of(self, process_id: str) -> bytes:
        return bytes(self._procs[process_id].stdin)

    def signals_of(self, process_id: str) -> list[str]:
        return list(self._procs[process_id].signals)

    async def end_watches(self) -> None:
        """As a sandbox that stops: every watch ends before its process did."""
        self.closed = True
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _get(self, process_id: str) -> _Process:
        p = self._procs.get(process_id)
        if p is None:
            raise ProcessError("no_process", f"no process {process_id!r} in this session")
        return p

    # -- ProcessControl --------------------------------------------------------------------------

    async def start(self, request: ProcessStart) -> ProcessInfo:
        known = self._procs.get(request.process_id)
        if known is not None:
            if known.info.command != request.command:
                raise ProcessError("conflict", f"{request.process_id} runs another command")
            return known.info
        if sum(p.info.running for p in self._procs.values()) >= self.running_limit:
            raise ProcessError("too_many", f"{self.running_limit} processes already run in this session")
        info = ProcessInfo(
            process_id=request.process_id,
            command=request.command,
            cwd=request.cwd,
            pid=1000 + len(self._procs),
            state="running",
            exit_code=None,
            signal=None,
            started=time.time(),
            ended=None,
            tool_use_id=request.tool_use_id,
            end=0,
            first=0,
            ring_bytes=request.ring_bytes or self.ring_bytes,
            stdin_open=True,
            origin="background",
        )
        self._procs[request.process_id] = _Process(info)
        return info

    async def list(self) -> tuple[ProcessInfo, ...]:
        return tuple(p.info for p in self._procs.values())

    async def read(
        self, process_id: str, *, after: int = 0, wait_seconds: float = 0.0, max_bytes: int = 64 * 1024
    ) -> ProcessOutput:
        p = self._get(process_id)
        start = max(after, p.first)
        chunks = tuple(_from(c, start) for c in p.ring if c.cursor + len(c.data) > start)
        nxt = chunks[-1].cursor + len(chunks[-1].data) if chunks else max(after, p.info.end)
        i = p.info
        return ProcessOutput(chunks, nxt, start - after, i.state, i.exit_code, i.signal)

    async def watch(self, process_id: str, *, after: int = 0) -> AsyncIterator[OutputChunk | ProcessInfo]:
        p = self._get(process_id)
        cursor = after
        self.watching += 1
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(
                        lambda c=cursor: self.closed or p.info.end > c or not p.info.running  # type: ignore[misc]
                    )
                if p.info.end > cursor:
                    start = max(cursor, p.first)
                    lost = start - cursor
                    for c in list(p.ring):
                        if c.cursor + len(c.data) > start:
                            piece = _from(c, start)
                            self.taken += 1
                            yield OutputChunk(piece.stream, piece.cursor, piece.data, lost)
                            lost = 0
                            start = piece.cursor + len(piece.data)
                    cursor = start
                    continue
                self.taken += 1
                yield p.info  # ended with every byte out, or the sandbox ended the watch (running)
                return
        finally:
            self.watching -= 1

    async def wait(self, process_id: str) -> ProcessInfo:
        p = self._get(process_id)
        async with self._changed:
            await self._changed.wait_for(lambda: not p.info.running)
        return p.info

    async def write_input(self, process_id: str, data: bytes, *, close: bool = False) -> ProcessInfo:
        p = self._get(process_id)
        if not p.info.running or not p.info.stdin_open:
            raise ProcessError(
                "not_running", f"{process_id} takes no more input (it ended or its stdin was closed)"
            )
        if len(p.stdin) + len(data) > STDIN_LIMIT:
            raise ProcessError(
                "too_large", f"{process_id}'s stdin holds at most {STDIN_LIMIT} bytes not yet read"
            )
        p.stdin += data
        if close:
            p.info = _with(p.info, stdin_open=False)
        return p.info

    async def signal(
        self, process_id: str, signal: str, *, grace_seconds: float | None = None
    ) -> ProcessInfo:
        assert signal in PROCESS_SIGNALS
        p = self._get(process_id)
        if not p.info.running:
            return p.info
        p.signals.append(signal)
        if signal in ("TERM", "KILL", "INT", "HUP", "QUIT") or grace_seconds is not None:
            await self.finish(process_id, None, signal=SIGNAL_NUMBERS[signal])
        return p.info


def _from(chunk: OutputChunk, start: int) -> OutputChunk:
    skip = max(0, start - chunk.cursor)
    return OutputChunk(chunk.stream, chunk.cursor + skip, chunk.data[skip:])


def _with(info: ProcessInfo, **changes: object) -> ProcessInfo:
    return replace(info, **changes)  # type: ignore[arg-type]


@dataclass
class TableSandbox(FakeSandbox):
    """The fake sandbox with this module's process table (``memory``: kept apart from any table
    the fake sandbox has of its own)."""

    memory: MemoryProcessTable = field(default_factory=MemoryProcessTable)

    def processes(self) -> MemoryProcessTable:
        return self.memory


@dataclass
class TablelessSandbox(FakeSandbox):
    """The fake sandbox of a backend that keeps no processes."""

    def processes(self) -> MemoryProcessTable:
        raise ProcessError("unsupported", "this sandbox has no process table (a test's backend without one)")


class TableSandboxProvider(FakeSandboxProvider):
    """The fake backend whose sandboxes have a process table; ``without`` names sessions whose
    sandbox has none (a backend that cannot)."""

    def __init__(self) -> None:
        super().__init__()
        self.without: set[str] = set()

    def sandbox_for(self, session: Session) -> FakeSandbox:
        if session.session_id in self.without:
            return self.sandboxes.setdefault(session.session_id, TablelessSandbox())
        return self.sandboxes.setdefault(session.session_id, TableSandbox())

    def table(self, session_id: str) -> MemoryProcessTable:
        sandbox = self.sandboxes.setdefault(session_id, TableSandbox())
        assert isinstance(sandbox, TableSandbox)
        return sandbox.memory
