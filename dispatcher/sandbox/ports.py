"""The host's side of ``tunnel_connect``: one connection to a port of the sandbox's loopback, for a
preview or a port-forward, as a ``core.sandbox_api.PortStream``.

The connection is a ``tunnels.ChannelTunnel`` like the egress listener's: the same frames, windows
and credit, so a stalled reader at either end holds the other at a window, never more. Its frames
travel on the ``tunnel_connect`` request's own id, which stays registered with the link until the
agent says the connection is gone (``tunnel_close``) or the link breaks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from dispatcher.core.sandbox_api import PortError
from dispatcher.sandbox.agent.protocol import (
    Error,
    ProtocolError,
    TunnelClosed,
    TunnelData,
    TunnelEof,
    TunnelOpened,
    TunnelWindow,
)
from dispatcher.sandbox.tunnels import ChannelTunnel, TunnelLink

__all__ = ["PortConnection"]


class PortConnection:
    """The call of one ``tunnel_connect``: its answer, then its connection's frames."""

    def __init__(self, link: TunnelLink, port: int) -> None:
        self.link = link
        self.port = port
        self.opened: asyncio.Future[ChannelTunnel] = asyncio.get_running_loop().create_future()
        self._tunnel: ChannelTunnel | None = None
        self.finished = False
        """Nothing more comes on its id: the link forgets it."""

    def deliver(self, kind: str, header: Mapping[str, Any], payload: bytes) -> None:
        """One frame of the request (``ProtocolError`` if it breaks the protocol)."""
        tunnel = self._tunnel
        if kind == "tunnel_open":
            if tunnel is not None or self.opened.done():
                raise ProtocolError("a port connection opened twice")
            tunnel = self._tunnel = ChannelTunnel(self, TunnelOpened.decode(header).conn)
            self.opened.set_result(tunnel)
            return
        if kind == "error" and tunnel is None:
            error = Error.decode(header)
            self.finished = True
            if not self.opened.done():
                self.opened.set_exception(_port_error(self.port, error))
            return
        if tunnel is None:
            raise ProtocolError(f"unexpected {kind!r} frame before the port connection opened")
        if kind == "tunnel_data":
            data = TunnelData.decode(header, payload)
            _same(tunnel, data.conn)
            tunnel.received(data.data)
        elif kind == "tunnel_credit":
            window = TunnelWindow.decode(header)
            _same(tunnel, window.conn)
            tunnel.credited(window.credit)
        elif kind == "tunnel_eof":
            _same(tunnel, TunnelEof.decode(header).conn)
            tunnel.ended()
        elif kind == "tunnel_close":
            _same(tunnel, TunnelClosed.decode(header).conn)
            self.finished = True
            tunnel.lost()
        else:
            raise ProtocolError(f"unexpected {kind!r} frame for a port connection")

    def forget(self, conn: int) -> None:
        """Closed on this side: what the agent still sends is read until its ``tunnel_close``."""

    def broken(self, error: BaseException) -> None:
        """The link broke: the connection is gone, or never opens."""
        self.finished = True
        if not self.opened.done():
            self.opened.set_exception(error)
            self.opened.exception()  # seen: the caller may have given up already
        if self._tunnel is not None:
            self._tunnel.lost()


def _same(tunnel: ChannelTunnel, conn: int) -> None:
    if conn != tunnel.conn:
        raise ProtocolError(f"frame for connection {conn} on connection {tunnel.conn}'s request")


def _port_error(port: int, error: Error) -> PortError:
    message = error.message[:500]
    if error.code == "too_many":
        return PortError("too_many", f"the sandbox holds too many port connections: {message}")
    if error.code == "ECONNREFUSED":
        return PortError("refused", f"nothing listens on port {port} in the sandbox ({message})")
    return PortError("refused", f"cannot connect to port {port} in the sandbox: {error.code}: {message}")
