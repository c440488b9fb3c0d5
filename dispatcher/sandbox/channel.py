"""Host side of the agent protocol: the core ``Sandbox`` API over one agent link.

``AgentLink`` (agent_link.py) frames requests and replies and breaks on anything untrusted the
agent sends; this adds the operations: workspace files, exec with its kill sequence, and the
session's background processes (the agent's process table), mapped to ``core.process_api``'s
types, with the agent's refusals as ``ProcessError``s whose text tells a model what to do.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import AsyncGenerator
from typing import Any, Literal, cast

from dispatcher.core.process_api import (
    PROCESS_SIGNALS,
    OutputChunk,
    ProcessError,
    ProcessInfo,
    ProcessOutput,
    ProcessStart,
    ShellState,
)
from dispatcher.core.sandbox_api import (
    DirEntry,
    DirListing,
    EntryKind,
    ExecRequest,
    ExecResult,
    FileOpError,
    FileStat,
    OutputCallback,
    ProcessLimitExhausted,
    SandboxError,
)
from dispatcher.sandbox.agent.protocol import (
    CHUNK,
    MAX_READ,
    Append,
    Delete,
    Error,
    Exec,
    Exists,
    ListDir,
    Pause,
    ProcInfo,
    ProcInput,
    ProcListRequest,
    ProcRead,
    Procs,
    ProcSignal,
    ProcStart,
    ProcWatch,
    Read,
    Request,
    Resolve,
    SendSignal,
    Stat,
    Write,
)
from dispatcher.sandbox.agent_link import DEFAULT_MAX_FRAME as DEFAULT_MAX_FRAME
from dispatcher.sandbox.agent_link import KILL_WAIT_SECONDS as KILL_WAIT_SECONDS
from dispatcher.sandbox.agent_link import MAX_HEADER as MAX_HEADER
from dispatcher.sandbox.agent_link import AgentLink, ExecCall, encodable, error_for, settled
from dispatcher.sandbox.agent_link import AgentUnresponsive as AgentUnresponsive
from dispatcher.sandbox.agent_link import FrameWriter as FrameWriter
from dispatcher.sandbox.agent_link import NotDelivered as NotDelivered
from dispatcher.sandbox.processes.calls import (
    MAX_WAIT_SECONDS,
    PROCESS_CODES,
    check_request,
    process_error,
    to_chunk,
    to_info,
    to_output,
)
from dispatcher.sandbox.processes.watch import WATCH_BUFFER as WATCH_BUFFER


class AgentChannel(AgentLink):
    """Implements ``dispatcher.core.sandbox_api.Sandbox`` by talking to one agent process."""

    # -- WorkspaceFileAPI -------------------------------------------------------------------

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes:
        """Read at most ``max_bytes`` (``too_large`` if the file is bigger and no cap was asked)."""
        strict = max_bytes is None or max_bytes > self._max_frame
        cap = self._max_frame if max_bytes is None or strict else max(max_bytes, 0)
        reply = await self.call(Read(path, cap, strict, approved))
        return reply.data

    async def read(self, path: str) -> str:
        """Read a UTF-8 text file."""
        data = await self.read_bytes(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileOpError("decode", f"{path}: not valid UTF-8 text") from None

    def _payload(self, path: str, data: bytes) -> bytes:
        if len(data) > self._max_frame:
            raise FileOpError("too_large", f"{path}: {len(data)} bytes is more than {self._max_frame}")
        return data

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """Atomic replace (temp file in the same directory + rename), keeping the mode; makes parents;
        with ``expect_sha256``, only if the file is still that (checked by the agent before the rename)."""
        await self.call(Write(path, self._payload(path, data), approved, expect_sha256))

    async def write(
        self, path: str, content: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """Write text as UTF-8, atomically."""
        await self.write_bytes(path, _encode(path, content), approved=approved, expect_sha256=expect_sha256)

    async def append(self, path: str, content: str) -> None:
        """Append text as UTF-8, creating the file if needed."""
        await self.call(Append(path, self._payload(path, _encode(path, content))))

    async def exists(self, path: str) -> bool:
        """True if the path exists inside the workspace."""
        return (await self.call(Exists(path))).exists

    async def stat(self, path: str, *, approved: str | None = None) -> FileStat:
        """Kind, size, mode and mtime; symlinks are followed (inside the workspace)."""
        reply = await self.call(Stat(path, approved))
        rel = reply.path
        full = self._root if rel == "." else posixpath.join(self._root, encodable(rel))
        return FileStat(
            path=full, kind=_kind(reply.kind), size=reply.size, mode=reply.mode, mtime=reply.mtime
        )

    async def list(self, path: str, *, limit: int = 1000, approved: str | None = None) -> DirListing:
        """Up to ``limit`` entries sorted by name; ``truncated`` when more existed."""
        reply = await self.call(ListDir(path, max(limit, 0), approved))
        # Names and targets keep the lone surrogates of bytes that were not UTF-8 (os.fsdecode's
        # convention) so that list_dir can show them escaped and unambiguously; the core makes any
        # text it returns encodable, so a tool that passes one on unescaped cannot break a stream.
        entries = tuple(DirEntry(e.name, _kind(e.kind), e.size, e.target) for e in reply.entries)
        return DirListing(entries=entries, truncated=reply.truncated)

    async def delete(self, path: str) -> None:
        """Remove a file, a symlink or an empty directory."""
        await self.call(Delete(path))

    async def resolve(self, path: str) -> str:
        """The real path inside the workspace, relative to it, symlinks followed where the files are."""
        # Exact: a name's undecodable bytes stay lone surrogates, so the path can be handed back as
        # the approved one; whoever shows it escapes them (``visible``).
        return (await self.call(Resolve(path))).path

    # -- processes --------------------------------------------------------------------------

    async def exec(
        self, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
    ) -> ExecResult:
        """Run a command, streaming its output; on timeout or cancel: SIGTERM, grace, SIGKILL.

        Raises:
            AgentUnresponsive: the group outlived SIGKILL by ``kill_wait`` or the agent went silent.
            SandboxError: the channel is broken or broke meanwhile.
        """
        self._usable()
        loop = asyncio.get_running_loop()
        started = loop.time()
        if cancel_event.is_set():
            return ExecResult(exit_code=None, cancelled=True)
        stdin = request.stdin
        if stdin is not None and len(stdin) > self._max_frame:
            raise SandboxError(f"stdin of {len(stdin)} bytes is more than {self._max_frame}")
        call = ExecCall(on_output, loop.create_future(), tool_use_id=request.tool_use_id)
        rid = self._register(call)
        command = Exec(
            request.command,
            request.cwd,
            dict(request.env),
            stdin,
            request.approved_cwd,
            request.leave_as,
            request.capture_state,
        )
        timed_out = cancelled = killed = False
        try:
            await self._send(rid, command)
            outcome = await self._wait_first(call, cancel_event, request.timeout)
            if outcome != "done":
                timed_out, cancelled = outcome == "timeout", outcome == "cancel"
                call.draining.set()  # its output no longer waits for its reader: its end is read
                self._post(SendSignal(rid, "TERM"))
                if not await settled(call.done, request.grace_seconds):
                    self._post(SendSignal(rid, "KILL"))
                    killed = True
                    if not await settled(call.done, self._kill_wait):
                        self._pending.pop(rid, None)
                        raise self._fail(AgentUnresponsive("the command's process group survived SIGKILL"))
            reply = call.done.result()
        finally:
            call.draining.set()
            if self._pending.pop(rid, None) is not None:
                self._post(SendSignal(rid, "KILL"))  # abandoned: leave nothing
            if call.done.done() and not call.done.cancelled():
                call.done.exception()  # as in _call: a failed send must not leave it unretrieved
        if call.callback_error is not None:
            raise call.callback_error
        if isinstance(reply, Error):
            if reply.code == "proc_limit":  # refused before anything ran
                processes = max(reply.processes or 0, 0)
                raise ProcessLimitExhausted(str(error_for(reply)), processes=processes)
            raise error_for(reply)
        return ExecResult(
            exit_code=reply.exit_code,
            signal=reply.signal,
            timed_out=timed_out,
            cancelled=cancelled,
            killed=killed,
            duration_ms=(loop.time() - started) * 1000.0,
            left=reply.left,
            # No environment: the shell could not tell (``exec prog``, a signal, its own trap).
            shell_state=None if reply.env is None else ShellState(reply.cwd, dict(reply.env), reply.unset),
        )

    async def _wait_first(
        self, call: ExecCall, cancel_event: asyncio.Event, timeout: float
    ) -> Literal["done", "timeout", "cancel"]:
        watchers: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(cancel_event.wait()),
            asyncio.ensure_future(call.interrupted.wait()),
        ]
        try:
            await asyncio.wait(
                [call.done, *watchers], timeout=max(timeout, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        if call.done.done():
            return "done"
        return "cancel" if cancel_event.is_set() or call.interrupted.is_set() else "timeout"

    async def procs(self, *, kill: bool = False, spare_exec_sessions: bool = False) -> tuple[int, int, int]:
        """(processes commands left running, how many were killed, processes left); ``kill``
        stops and kills them all (the agent's and init's excepted). ``spare_exec_sessions``: leave
        out the processes of sessions the server attached itself (sandboxed MCP servers)."""
        reply = await self.call(Procs(kill, spare_exec_sessions))
        return reply.processes, reply.killed, reply.left

    async def pause(self, paused: bool) -> int:
        """Stop (``SIGSTOP``) every process commands started, or continue (``SIGCONT``) those
        earlier pauses stopped; how many (see ``Pause``). For sandboxes that cannot be frozen."""
        reply = await self.call(Pause(paused))
        return reply.processes

    # -- background processes (the agent's table; ``core.process_api``) -------------------------

    async def start_process(self, request: ProcessStart) -> ProcessInfo:
        """Start ``sh -c command`` in the background (or answer the record of the same id and
        command: a retried start starts one process).

        Raises:
            ToolValidationError: a malformed id, command, environment or ring size.
            ProcessError: ``conflict``, ``too_many``, ``too_large``.
            FileOpError, WorkspaceEscapeError, ToolPermissionDenied: its ``cwd`` is unusable.
        """
        message = ProcStart(
            request.process_id,
            request.command,
            request.cwd,
            dict(request.env),
            request.tool_use_id,
            request.ring_bytes,
            request.approved_cwd,
        )
        check_request(message, f"process {request.process_id!r}")
        return to_info(await self._process_call(message, request.process_id, "start"))

    async def list_processes(self) -> tuple[ProcessInfo, ...]:
        """Every process of the table, running and the finished ones kept, oldest first."""
        reply = await self.call(ProcListRequest())
        return tuple(to_info(record) for record in reply.processes)

    async def read_process(
        self, process_id: str, *, after: int = 0, wait_seconds: float = 0.0, max_bytes: int = CHUNK
    ) -> ProcessOutput:
        """Output after cursor ``after`` (at most ``max_bytes``, held to ``MAX_READ``), waiting up
        to ``wait_seconds`` (held to ``MAX_WAIT_SECONDS``) for some or for the end.

        Raises:
            ProcessError: ``no_process``.
        """
        message = ProcRead(
            process_id,
            max(after, 0),
            min(max(wait_seconds, 0.0), MAX_WAIT_SECONDS),
            min(max(max_bytes, 1), MAX_READ),
        )
        check_request(message, process_id)
        reply = await self._process_call(message, process_id, "read")
        return to_output(reply)

    async def write_process_input(self, process_id: str, data: bytes, *, close: bool = False) -> ProcessInfo:
        """Queue ``data`` for its stdin (all of it or nothing), then close it if ``close``.

        Raises:
            ProcessError: ``no_process``, ``not_running``, ``too_large``.
        """
        if len(data) > self._max_frame:
            raise ProcessError(
                "too_large",
                f"{len(data)} bytes of input in one write is more than {self._max_frame}; send it in parts",
            )
        message = ProcInput(process_id, data, close)
        check_request(message, process_id)
        return to_info(await self._process_call(message, process_id, "input"))

    async def signal_process(
        self, process_id: str, signal: str, *, grace_seconds: float | None = None
    ) -> ProcessInfo:
        """``signal`` to its whole process group; with ``grace_seconds`` (held to
        ``MAX_WAIT_SECONDS``), ``KILL`` once that passed, answered when the group is empty.

        Raises:
            ToolValidationError: an unknown signal.
            ProcessError: ``no_process``.
        """
        grace = None if grace_seconds is None else min(max(grace_seconds, 0.0), MAX_WAIT_SECONDS)
        message = ProcSignal(process_id, signal, grace)
        check_request(message, f"signal {signal!r} (one of {', '.join(PROCESS_SIGNALS)})")
        return to_info(await self._process_call(message, process_id, "signal"))

    async def watch_process(
        self, process_id: str, *, after: int = 0, buffer_bytes: int = WATCH_BUFFER
    ) -> AsyncGenerator[OutputChunk | ProcessInfo, None]:
        """Its output from cursor ``after`` as it comes (a chunk's ``lost``: bytes before it the
        ring dropped), then its record once it ended and every byte went out. Closing the
        iterator stops the agent's watch. At most ``buffer_bytes`` wait here for a slow consumer:
        past that the watch is ended and begun again from where the consumer is (``WatchCall``).

        Raises:
            ProcessError: ``no_process``.
            SandboxError: the channel broke.
        """
        position = max(after, 0)
        while True:
            message = ProcWatch(process_id, position)
            check_request(message, process_id)
            rid, call = self.register_watch(message, limit=buffer_bytes)
            try:
                await self.send_registered(rid, message)
                while True:
                    item = await call.next()
                    if item is None:  # its buffer overflowed and is empty now: watch again
                        break
                    if isinstance(item, BaseException):
                        raise item
                    if isinstance(item, Error):
                        raise process_error(item, process_id, "watch")
                    if isinstance(item, ProcInfo):
                        yield to_info(item)
                        return
                    yield to_chunk(item)
            finally:
                self.unwatch(rid)
            position = call.position

    async def _process_call(self, message: Request[Any], process_id: str, what: str) -> Any:
        try:
            return await self.call(message)
        except FileOpError as exc:
            if exc.code in PROCESS_CODES:
                raise process_error(Error(exc.code, exc.message), process_id, what) from None
            raise


def _kind(kind: str) -> EntryKind:
    """A kind the protocol checked (``KINDS``), typed for the core."""
    return cast(EntryKind, kind)


def _encode(path: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FileOpError("decode", f"{path}: text cannot be encoded as UTF-8") from None
