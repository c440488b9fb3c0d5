"""The host's side of the sandbox's proxy listener: the agent channel's tunnel frames as one
``TunnelStream`` per connection, each served by the egress proxy.

Why the agent channel and not a unix socket mounted into the container: gVisor refuses connecting
to host unix sockets by default, and the Kubernetes backend reaches its agent only through an
attach stream. One transport serves every backend, and the connection frames ride the stream the
agent already has.

Flow control is per connection and per direction: the agent sends at most ``HOST_WINDOW`` ahead
of the credit this side returns as the proxy reads, and this side sends at most ``SANDBOX_WINDOW``
ahead of the agent's credit. So one slow connection buffers a window at each end, never more, and
never holds up the channel's other traffic (the read loop only appends to a buffer the window
bounds; a frame beyond the window breaks the link as any protocol violation does). Credit goes
back once per half window, and a chunk the proxy read whole from the origin travels uncopied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.egress.gate import EgressGate, ca_env
from dispatcher.egress.proxy import TunnelStream
from dispatcher.sandbox.agent.protocol import (
    HOST_WINDOW,
    SANDBOX_WINDOW,
    TUNNEL_CHUNK,
    Error,
    Listening,
    ProtocolError,
    Request,
    TunnelClose,
    TunnelClosed,
    TunnelCredit,
    TunnelData,
    TunnelEof,
    TunnelOpened,
    TunnelSend,
    TunnelShut,
    TunnelWindow,
)

if TYPE_CHECKING:
    from dispatcher.core.sessions.session import Session

__all__ = ["ChannelTunnel", "Serve", "TunnelLink", "TunnelMux", "TunnelSetup", "tunnel_setup"]

log = logging.getLogger(__name__)

Serve = Callable[[TunnelStream, "str | None"], Awaitable[None]]
"""Serves one connection to its end: (the stream, the tool_use_id of the call that opened it)."""
_CREDIT_STEP = HOST_WINDOW // 2
"""Bytes read before the agent is told (see the agent's own ``_CREDIT_STEP``)."""


@dataclass(frozen=True, slots=True)
class TunnelSetup:
    """How a session's agent listens: who serves its connections, what its commands are told."""

    serve: Serve
    env: dict[str, str]
    """The CA bundle's variables (the proxy's own the agent adds, knowing its port)."""


def tunnel_setup(
    gate: EgressGate | None, session: Session, *, ca_path: Callable[[str], str] = str
) -> TunnelSetup | None:
    """The setup of ``session``'s listener; None without an egress proxy. ``ca_path``: where the
    tenant's CA bundle (a host path) is seen from the sandbox."""
    if gate is None:
        return None
    bundle = gate.ca_bundle(session.tenant_id)
    return TunnelSetup(partial(gate.serve, session.session_id), ca_env(ca_path(bundle) if bundle else None))


class TunnelLink(Protocol):
    """What the mux needs of the agent link."""

    def post(self, request: Request[Any]) -> None:
        """Send a frame that is never answered, without waiting (small frames)."""

    async def send_unanswered(self, request: Request[Any]) -> None:
        """Send a frame that is never answered, waiting for the channel's buffer (data)."""

    def violation(self, what: str) -> Exception:
        """Break the link over a frame that broke the protocol."""

    def tool_use_of(self, exec_id: int | None) -> str | None:
        """The tool_use_id of the running exec ``exec_id``."""


class TunnelOwner(Protocol):
    """Whoever routes a connection's frames to it: the listener's mux, or a connected port's call."""

    link: TunnelLink

    def forget(self, conn: int) -> None:
        """The connection was closed on this side."""


class ChannelTunnel:
    """One sandbox connection as a ``TunnelStream`` (and a ``core.sandbox_api.PortStream``)."""

    def __init__(self, mux: TunnelOwner, conn: int) -> None:
        self._mux = mux
        self.conn = conn
        self._inbox: deque[bytes] = deque()
        self._buffered = 0
        self._unacked = 0  # bytes read by the proxy since the last credit we gave
        self._window = SANDBOX_WINDOW  # bytes we may still send
        self._eof = False  # nothing more comes from the sandbox
        self._gone = False  # the sandbox side is closed: writes fail
        self._closed = False  # we closed it
        self._shut = False  # we half-closed it: nothing more is written
        self._changed = asyncio.Event()

    # -- TunnelStream ---------------------------------------------------------------------

    async def read(self, n: int) -> bytes:
        while not self._inbox and not self._eof:
            self._changed.clear()
            await self._changed.wait()
        if not self._inbox:
            return b""
        data = self._inbox.popleft()
        if len(data) > n:
            self._inbox.appendleft(data[n:])
            data = data[:n]
        self._buffered -= len(data)
        self._unacked += len(data)
        if self._unacked >= _CREDIT_STEP:
            if not self._gone and not self._closed:
                self._mux.link.post(TunnelCredit(self.conn, self._unacked))
            self._unacked = 0
        return data

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            while self._window <= 0 and not self._gone and not self._closed:
                self._changed.clear()
                await self._changed.wait()
            if self._gone or self._closed or self._shut:
                raise ConnectionResetError("the sandbox closed the connection")
            n = min(len(view), self._window, TUNNEL_CHUNK)
            self._window -= n
            # All of it in one frame (the proxy reads the origin a chunk at a time): sent uncopied.
            chunk = data if n == len(data) else bytes(view[:n])
            await self._mux.link.send_unanswered(TunnelSend(self.conn, chunk))
            view = view[n:]

    async def shut_write(self) -> None:
        """Half-close (``tunnel_shut``): the sandbox's side reads its end; reading goes on."""
        if self._shut or self._closed:
            return
        self._shut = True
        if not self._gone:
            self._mux.link.post(TunnelShut(self.conn))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._changed.set()
        if not self._gone:
            self._mux.link.post(TunnelClose(self.conn))
        # Frames the agent sent before it saw the close still arrive: they find no connection.
        self._mux.forget(self.conn)

    # -- from the mux ---------------------------------------------------------------------

    def received(self, data: bytes) -> None:
        if self._buffered + len(data) > HOST_WINDOW:
            raise ProtocolError(f"tunnel {self.conn}: more data than its window")
        if self._eof:
            raise ProtocolError(f"tunnel {self.conn}: data after its end")
        self._inbox.append(data)
        self._buffered += len(data)
        self._changed.set()

    def ended(self) -> None:
        self._eof = True
        self._changed.set()

    def lost(self) -> None:
        self._eof = self._gone = True
        self._changed.set()

    def credited(self, credit: int) -> None:
        if self._window + credit > SANDBOX_WINDOW:
            raise ProtocolError(f"tunnel {self.conn}: credit beyond its window")
        self._window += credit
        self._changed.set()


class TunnelMux:
    """The connections of one agent's listener; the link routes the listen request's frames here."""

    def __init__(self, link: TunnelLink, serve: Serve) -> None:
        self.link = link
        self._serve = serve
        self._conns: dict[int, ChannelTunnel] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.listening: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._seen = 0  # the highest connection id opened: an id is never reused

    def deliver(self, kind: str, header: Mapping[str, Any], payload: bytes) -> None:
        """One frame of the listen request (``ProtocolError`` if it breaks the protocol)."""
        if kind == "tunnel_data":
            data = TunnelData.decode(header, payload)
            tunnel = self._conns.get(data.conn)
            if tunnel is not None:
                tunnel.received(data.data)
            elif not 0 < data.conn <= self._seen:
                raise ProtocolError(f"data for tunnel {data.conn}, which was never opened")
        elif kind == "tunnel_credit":
            window = TunnelWindow.decode(header)
            if (tunnel := self._conns.get(window.conn)) is not None:
                tunnel.credited(window.credit)
        elif kind == "tunnel_open":
            self._open(TunnelOpened.decode(header))
        elif kind == "tunnel_eof":
            if (tunnel := self._conns.get(TunnelEof.decode(header).conn)) is not None:
                tunnel.ended()
        elif kind == "tunnel_close":
            if (tunnel := self._conns.pop(TunnelClosed.decode(header).conn, None)) is not None:
                tunnel.lost()
        elif kind == "listening" and not self.listening.done():
            self.listening.set_result(Listening.decode(header).port)
        elif kind == "error" and not self.listening.done():
            error = Error.decode(header)
            self.listening.set_exception(OSError(f"the agent cannot listen: {error.code}: {error.message}"))
        else:
            raise ProtocolError(f"unexpected {kind!r} frame for the tunnel listener")

    def _open(self, opened: TunnelOpened) -> None:
        if opened.conn <= self._seen:
            raise ProtocolError(f"tunnel {opened.conn} opened twice")
        self._seen = opened.conn
        tunnel = ChannelTunnel(self, opened.conn)
        self._conns[opened.conn] = tunnel
        call = self.link.tool_use_of(opened.exec_id)
        task = asyncio.get_running_loop().create_task(self._run(tunnel, call), name="egress-tunnel")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, tunnel: ChannelTunnel, call: str | None) -> None:
        try:
            await self._serve(tunnel, call)
        except Exception as exc:  # the proxy never raises; a bug here must not go unseen
            log.warning("serving a sandbox tunnel failed: %r", exc)
        finally:
            with contextlib.suppress(Exception):
                await tunnel.close()

    def forget(self, conn: int) -> None:
        self._conns.pop(conn, None)

    @property
    def open_tunnels(self) -> int:
        return len(self._conns)

    def broken(self, error: BaseException) -> None:
        """The link broke: every connection is gone."""
        if not self.listening.done():
            self.listening.set_exception(error)
            self.listening.exception()  # seen: nobody may be waiting any more
        conns, self._conns = list(self._conns.values()), {}
        for tunnel in conns:
            tunnel.lost()
