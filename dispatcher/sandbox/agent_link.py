"""The agent protocol's link: one framed byte stream to one agent, its calls in flight, and what
breaks it.

Output is read no faster than its reader takes it: when a command's ``on_output`` hands back a
future (the Dispatch's caller is behind), the link reads nothing more until it is done or the
command is being stopped (``ExecCall.draining``). The agent then blocks writing, its pipe fills
and the command waits, as in a terminal; meanwhile the other answers of this sandbox wait too
(the protocol has one stream, no window per command), for as long as the command may run at most.

Everything the agent sends is untrusted. Frames are size-bounded and every message is decoded
and checked through ``agent.protocol``, the schema both ends share; any violation, or the stream ending, breaks the link: pending and future calls
fail with ``SandboxError`` and the owner (the Docker or local backend) replaces the agent.
``channel.AgentChannel`` adds the typed operations (files, exec, processes) on top.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

from dispatcher.core.errors import ToolPermissionDenied, WorkspaceEscapeError
from dispatcher.core.sandbox_api import (
    FileOpError,
    OutputCallback,
    PortError,
    PortStream,
    SandboxError,
    check_port,
)
from dispatcher.sandbox.agent.protocol import (
    PREFIX,
    Error,
    Exit,
    Message,
    Output,
    Ping,
    ProcData,
    ProcInfo,
    ProcUnwatch,
    ProcWatch,
    ProtocolError,
    Request,
    TunnelConnect,
    TunnelListen,
    decode_header,
    decode_prefix,
    request_writes,
    response_head,
)
from dispatcher.sandbox.ports import PortConnection
from dispatcher.sandbox.processes.watch import WATCH_BUFFER, WatchCall
from dispatcher.sandbox.tunnels import Serve, TunnelMux

log = logging.getLogger(__name__)

DEFAULT_MAX_FRAME = 32 << 20  # largest payload either way: caps file reads and writes
MAX_HEADER = 64 << 10  # agent headers are small; bulk data travels in payloads
KILL_WAIT_SECONDS = 2.0  # after SIGKILL, how long the group may take before the agent is given up
MAX_MESSAGE = 1000  # characters of an agent error message passed on
_AGENT_FAULTS = frozenset({"bad_request", "internal", "protocol"})  # the agent blames the host
_R = TypeVar("_R", bound=Message)


class AgentUnresponsive(SandboxError):
    """The agent, or a process group it runs, no longer responds; stop and recreate the sandbox."""


class NotDelivered(SandboxError):
    """The channel was already broken when a request was to be sent: nothing of it ran."""


class FrameWriter(Protocol):
    """The byte sink towards the agent (an ``asyncio.StreamWriter`` fits)."""

    def write(self, data: bytes) -> Any: ...

    async def drain(self) -> None: ...

    def close(self) -> Any: ...


@dataclass(eq=False)
class _Call:
    request: Request[Any]  # its reply is decoded, and checked, against it
    future: asyncio.Future[Message]


@dataclass(eq=False)
class ExecCall:
    on_output: OutputCallback
    done: asyncio.Future[Exit | Error]
    interrupted: asyncio.Event = field(default_factory=asyncio.Event)
    callback_error: BaseException | None = None
    draining: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the command is being stopped (timeout, cancel): its output no longer waits for its
    reader, so its end is read within the kill sequence."""
    tool_use_id: str | None = None
    """The call it runs for: connections its processes open to the proxy are that call's."""


class AgentLink:
    """One agent process at the end of a framed stream: requests, replies, and the link's failure."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: FrameWriter,
        *,
        workspace_root: str = "/workspace",
        max_frame: int = DEFAULT_MAX_FRAME,
        kill_wait: float = KILL_WAIT_SECONDS,
        first_id: int = 1,
    ) -> None:
        """``first_id``: the first request id; answers to lower ids are taken as late and ignored
        (an agent that outlived its previous link may still answer that link's calls)."""
        self._reader = reader
        self._writer = writer
        self._root = workspace_root.rstrip("/") or "/"
        self._max_frame = max_frame
        self._kill_wait = kill_wait
        self._pending: dict[int, _Call | ExecCall | TunnelMux | PortConnection | WatchCall] = {}
        self._next_id = first_id
        self._failure: SandboxError | None = None
        self._read_task: asyncio.Task[None] | None = None

    @property
    def workspace_root(self) -> str:
        return self._root

    @property
    def broken(self) -> bool:
        """True once the channel failed or was closed; every call will raise ``SandboxError``."""
        return self._failure is not None

    # -- plumbing ---------------------------------------------------------------------------

    def _fail(self, error: SandboxError, *, quiet: bool = False) -> SandboxError:
        """Break the channel (first failure wins) and fail everything still waiting."""
        if self._failure is None:
            self._failure = error
            if not quiet:
                log.warning("agent channel broken: %s", error)
        pending, self._pending = self._pending, {}
        for call in pending.values():
            if isinstance(call, (TunnelMux, PortConnection)):
                call.broken(self._failure)
                continue
            if isinstance(call, ExecCall):
                call.draining.set()  # nothing more of its output is waited for
            if isinstance(call, WatchCall):
                call.deliver(self._failure)
                continue
            waiter = call.future if isinstance(call, _Call) else call.done
            if not waiter.done():
                waiter.set_exception(self._failure)
        return self._failure

    def _usable(self) -> None:
        if self._failure is not None:
            raise NotDelivered(str(self._failure)) from self._failure
        if self._read_task is None:
            self._read_task = asyncio.get_running_loop().create_task(self._read_loop())

    def _register(self, call: _Call | ExecCall | TunnelMux | PortConnection | WatchCall) -> int:
        rid = self._next_id
        self._next_id += 1
        self._pending[rid] = call
        return rid

    async def _send(self, rid: int, request: Request[Any]) -> None:
        try:
            for data in request_writes(rid, request):
                self._writer.write(data)
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            raise self._fail(SandboxError(f"cannot write to the agent: {exc}")) from exc

    def _post(self, request: Request[Any]) -> None:
        """Send without waiting for buffer space or an answer (signals must not block)."""
        if self._failure is not None:
            return
        rid = self._next_id
        self._next_id += 1  # the agent's answer arrives as a late reply and is ignored
        try:
            for data in request_writes(rid, request):
                self._writer.write(data)
        except (OSError, RuntimeError) as exc:
            self._fail(SandboxError(f"cannot write to the agent: {exc}"))

    async def _read_loop(self) -> None:
        try:
            while True:
                prefix = await self._reader.readexactly(PREFIX.size)
                header_len, payload_len = decode_prefix(
                    prefix, max_header=MAX_HEADER, max_payload=self._max_frame
                )
                header = decode_header(await self._reader.readexactly(header_len))
                payload = await self._reader.readexactly(payload_len) if payload_len else b""
                paced = self._deliver(header, payload)
                if paced is not None:
                    await _until_room(*paced)
        except asyncio.IncompleteReadError:
            self._fail(SandboxError("the agent closed the channel"))
        except ProtocolError as exc:
            self._fail(SandboxError(f"agent protocol violation: {exc}"))
        except asyncio.CancelledError:
            self._fail(SandboxError("the channel was closed"), quiet=True)
            raise
        except Exception as exc:  # a failed read must never leave callers waiting forever
            self._fail(SandboxError(f"reading from the agent failed: {exc!r}"))

    def _deliver(
        self, header: dict[str, Any], payload: bytes
    ) -> tuple[asyncio.Future[None], ExecCall] | None:
        """Hand a response to its caller, decoded through the protocol (``ProtocolError`` if it
        breaks it: the read loop then breaks the link); for output whose reader is behind, what
        to wait for before reading on."""
        rid, kind = response_head(header)
        call = self._pending.get(rid)
        if call is None:
            if 0 < rid < self._next_id:
                return None  # a late answer to a call nobody waits for any more
            raise ProtocolError(f"response to request {rid}, which was never sent")
        if isinstance(call, TunnelMux):
            call.deliver(kind, header, payload)
            return None
        if isinstance(call, PortConnection):
            call.deliver(kind, header, payload)
            if call.finished:
                del self._pending[rid]
            return None
        if isinstance(call, WatchCall):
            self._deliver_watch(rid, call, kind, header, payload)
            return None
        if isinstance(call, _Call):
            if kind == "result":
                reply: Message = call.request.decode_reply(header, payload)
            elif kind == "error":
                reply = Error.decode(header)
            else:
                raise ProtocolError(f"unexpected {kind!r} frame for a file request")
            del self._pending[rid]
            if not call.future.done():  # a cancelled caller's future may already be done
                call.future.set_result(reply)
            return None
        if kind == "output":
            room = self._deliver_output(call, Output.decode(header, payload))
            return None if room is None else (room, call)
        if kind == "exit":
            end: Exit | Error = Exit.decode(header, payload)  # its payload: the shell's environment
        elif kind == "error":
            end = Error.decode(header)
        else:
            raise ProtocolError(f"unexpected {kind!r} frame for a command")
        del self._pending[rid]
        if not call.done.done():
            call.done.set_result(end)
        return None

    def _deliver_watch(
        self, rid: int, call: WatchCall, kind: str, header: dict[str, Any], payload: bytes
    ) -> None:
        """A watch's frame: output into its bounded buffer (see ``WatchCall``), or its end."""
        if kind == "proc_data":
            frame = ProcData.decode(header, payload)
            # Contiguous: each frame starts where the last ended, after the bytes it says were
            # lost; the first may start before the cursor asked when that was past the end.
            start = frame.cursor - frame.lost
            if start != call.position and not (call.first and start <= call.position):
                raise ProtocolError("process watch output is not contiguous")
            if call.items and call.buffered + len(frame.data) > call.limit:
                del self._pending[rid]
                call.overflowed = True
                call.ready.set()
                self._post(ProcUnwatch(rid))
                return
            call.first = False
            call.position = frame.cursor + len(frame.data)
            call.buffered += len(frame.data)
            call.deliver(frame)
            return
        if kind == "result":
            end: ProcInfo | Error = ProcInfo.decode(header, payload)
        elif kind == "error":
            end = Error.decode(header)
        else:
            raise ProtocolError(f"unexpected {kind!r} frame for a process watch")
        del self._pending[rid]
        call.deliver(end)

    def register_watch(self, request: ProcWatch, *, limit: int = WATCH_BUFFER) -> tuple[int, WatchCall]:
        """Register a watch (``AgentChannel.watch_process`` sends it and consumes it)."""
        self._usable()
        call = WatchCall(limit=max(limit, 1), position=request.after)
        return self._register(call), call

    async def send_registered(self, rid: int, request: Request[Any]) -> None:
        """Send the request of a call registered under ``rid`` (``watch``)."""
        await self._send(rid, request)

    def unwatch(self, rid: int) -> None:
        """Stop watch ``rid`` if it still runs: its late frames are ignored from now on."""
        if self._pending.pop(rid, None) is not None:
            self._post(ProcUnwatch(rid))

    def _deliver_output(self, call: ExecCall, output: Output) -> asyncio.Future[None] | None:
        if call.callback_error is not None:
            return None
        try:
            room = call.on_output("stdout" if output.stream == "stdout" else "stderr", output.data)
        except Exception as exc:  # the consumer's bug: stop the command, report after it is gone
            call.callback_error = exc
            call.interrupted.set()
            return None
        return None if room is None or room.done() or call.draining.is_set() else room

    async def call(self, request: Request[_R]) -> _R:
        """One request and the reply that ends it, checked against the request.

        Raises:
            FileOpError, WorkspaceEscapeError, ToolPermissionDenied: the agent's error answer.
            SandboxError: the channel is broken, or broke over a reply that broke the protocol.
        """
        self._usable()
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        rid = self._register(_Call(request, future))
        try:
            await self._send(rid, request)
            reply = await future
        finally:
            self._pending.pop(rid, None)
            if future.done() and not future.cancelled():
                # A failed send failed this future too (``_fail``); its error is the one raised.
                # Marked as seen, or the garbage collector logs it later, from any thread.
                future.exception()
        if isinstance(reply, Error):
            raise error_for(reply)
        return cast(_R, reply)  # decoded by ``request.decode_reply``: of its reply type

    # -- the egress proxy's tunnels (``tunnels.py``) --------------------------------------------

    async def open_tunnels(
        self, serve: Serve, *, port: int, env: dict[str, str], timeout: float = 10.0
    ) -> int:
        """Have the agent listen on its loopback's ``port`` (0: any) for proxy connections, each
        served by ``serve``; returns the port. Its commands get the proxy variables and ``env``.

        Raises:
            SandboxError: the channel is broken, or the agent could not listen.
        """
        self._usable()
        mux = TunnelMux(self, serve)
        rid = self._register(mux)
        await self._send(rid, TunnelListen(port, env))
        try:
            return await asyncio.wait_for(asyncio.shield(mux.listening), timeout)
        except (OSError, TimeoutError) as exc:
            self._pending.pop(rid, None)
            raise SandboxError(f"the sandbox's proxy listener did not start: {exc}") from exc

    async def connect_port(self, port: int, *, timeout: float = 10.0) -> PortStream:
        """A connection to ``127.0.0.1:port`` in the sandbox (``ports.py``).

        Raises:
            PortError: ``bad_port``, ``refused``, ``too_many``.
            SandboxError: the channel is broken, or the agent did not answer within ``timeout``.
        """
        check_port(port)
        self._usable()
        call = PortConnection(self, port)
        rid = self._register(call)
        await self._send(rid, TunnelConnect(port))
        try:
            return await asyncio.wait_for(asyncio.shield(call.opened), timeout)
        except TimeoutError:
            # Its late answer is ignored; a connection it opened then stays with the agent until
            # the channel ends (a loopback connect answers at once: this is a stuck agent).
            self._pending.pop(rid, None)
            raise SandboxError(
                f"the sandbox did not answer a connection to port {port} within {timeout} s"
            ) from None
        except PortError:
            raise
        except asyncio.CancelledError:
            self._pending.pop(rid, None)
            if call.opened.done() and not call.opened.cancelled() and call.opened.exception() is None:
                await call.opened.result().close()
            raise

    def post(self, request: Request[Any]) -> None:
        """Send a frame the agent never answers, without waiting (see ``_post``)."""
        self._post(request)

    async def send_unanswered(self, request: Request[Any]) -> None:
        """Send a frame the agent never answers, waiting for room in the channel's buffer."""
        if self._failure is not None:
            raise ConnectionResetError(str(self._failure))
        rid = self._next_id
        self._next_id += 1
        await self._send(rid, request)

    def tool_use_of(self, exec_id: int | None) -> str | None:
        call = self._pending.get(exec_id) if exec_id is not None else None
        return call.tool_use_id if isinstance(call, ExecCall) else None

    def violation(self, what: str) -> SandboxError:
        """Break the channel over an answer that broke the protocol, and return the error."""
        return self._violation(what)

    def _violation(self, what: str) -> SandboxError:
        return self._fail(SandboxError(f"agent protocol violation: {what}"))

    async def ping(self, timeout: float = 5.0) -> int:
        """Round-trip to the agent; returns the protocol version it speaks.

        Raises:
            AgentUnresponsive: no answer within ``timeout`` (the channel is then broken).
        """
        try:
            pong = await asyncio.wait_for(self.call(Ping()), timeout)
        except TimeoutError:
            raise self._fail(AgentUnresponsive(f"no answer to ping within {timeout} s")) from None
        return pong.version

    def abort(self, reason: str) -> None:
        """Break the channel now (its container is gone); pending calls fail with ``reason``."""
        self._fail(SandboxError(reason))

    async def close(self) -> None:
        """Break the channel, close the writer and stop reading; idempotent."""
        self._fail(SandboxError("the channel was closed"), quiet=True)
        with contextlib.suppress(Exception):
            self._writer.close()
            wait_closed = getattr(self._writer, "wait_closed", None)
            if wait_closed is not None:
                await asyncio.wait_for(wait_closed(), 1.0)
        task, self._read_task = self._read_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _until_room(room: asyncio.Future[None], call: ExecCall) -> None:
    """Until ``room`` is done (the reader caught up) or ``call`` is being stopped. ``room`` is the
    reader's, shared by whoever waits on it: never cancelled here."""
    stopping = asyncio.ensure_future(call.draining.wait())
    try:
        await asyncio.wait((room, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()


async def settled(future: asyncio.Future[Any], timeout: float) -> bool:
    if not future.done():
        await asyncio.wait([future], timeout=max(timeout, 0.0))
    return future.done()


def encodable(value: str) -> str:
    """Lone surrogates (legal in JSON escapes) replaced, so the text can be encoded downstream."""
    return value.encode("utf-8", "replace").decode("utf-8")


def error_for(error: Error) -> Exception:
    """The exception an agent's ``error`` answer stands for."""
    message = encodable(error.message[:MAX_MESSAGE])
    if error.code == "escape":
        return WorkspaceEscapeError(message)
    if error.code == "denied":
        return ToolPermissionDenied(message)
    if error.code in _AGENT_FAULTS:
        return SandboxError(f"agent refused the request ({error.code}): {message}")
    return FileOpError(error.code, message)
