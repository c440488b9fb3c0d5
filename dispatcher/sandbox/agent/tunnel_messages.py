"""The tunnels' messages: ``tunnel_listen`` and the frames of the connections it accepts, and
``tunnel_connect`` (the other way round: the host opens a connection to a port of the sandbox's
loopback, for a preview or a port-forward) whose one connection uses the same frames.

Part of the agent protocol's one schema: ``protocol.py`` re-exports every name here and lists the
requests among its ops, so the host imports ``protocol.py`` alone, as for every other op.

All the frames of the listener travel on the ``tunnel_listen`` request's id, like exec's output;
those of a ``tunnel_connect`` on its own id, starting with ``tunnel_open`` (or an ``error``: nothing
listens there) and ending with ``tunnel_close``. Either end may half-close: the sandbox's side with
``tunnel_eof``, the host's with ``tunnel_shut``; a connected connection is closed once both did.
Each connection the sandbox opens to its proxy port is one ``conn``. Bytes travel in
``tunnel_data`` frames of at most ``TUNNEL_CHUNK`` bytes, each way under a window that the receiver
reopens with ``tunnel_credit`` as it hands bytes on: neither end buffers more than a window per
connection, and a slow connection holds up nothing but itself. The windows differ by direction
because their costs do: the agent holds ``SANDBOX_WINDOW`` of a download (in the sandbox's own
memory), the server ``HOST_WINDOW`` of what a sandbox sends (in the server's, for every connection
of every sandbox).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .codec import BadMessage, Count, Done, Env, Reply, Request, check_env

TUNNEL_PORT = 3128
"""Where the agent listens in a sandbox container (``127.0.0.1``); the local backend asks for any."""
TUNNEL_CHUNK = 256 * 1024
"""The largest payload of a ``tunnel_data`` frame: per-frame costs (a header, a hand-over to the
agent's tunnel thread, a wake-up of each reader) are paid once per this many bytes."""
SANDBOX_WINDOW = 1 << 20
"""Bytes the server may send a connection ahead of the agent's credit (what the agent buffers).
It bounds a download's rate at a window per round trip of the channel."""
HOST_WINDOW = 512 * 1024
"""Bytes the agent may send ahead of the server's credit (what the server buffers per connection)."""
MAX_TUNNELS = 256
"""Connections the agent holds at once; more wait in the listen backlog."""
MAX_CONNECTS = 256
"""Connections the host may have opened to the sandbox's ports at once; more are refused
(``too_many``): the server bounds them per session well below this."""


def _tunnel_chunk(data: bytes) -> None:
    if not 0 < len(data) <= TUNNEL_CHUNK:
        raise BadMessage("tunnel data size out of bounds")


def _credit(credit: int, window: int) -> None:
    if not 0 < credit <= window:
        raise BadMessage("tunnel credit out of bounds")


@dataclass(frozen=True)
class Listening(Reply):
    """The first answer to ``tunnel_listen``: the port bound on ``127.0.0.1``."""

    TYPE: ClassVar[str] = "listening"
    port: Count


@dataclass(frozen=True)
class TunnelOpened(Reply):
    """A connection was accepted. ``exec_id``: the exec whose command's process opened it, when the
    agent could tell (``/proc``); None otherwise."""

    TYPE: ClassVar[str] = "tunnel_open"
    conn: Count
    exec_id: int | None = None


@dataclass(frozen=True)
class TunnelData(Reply):
    TYPE: ClassVar[str] = "tunnel_data"
    conn: Count
    data: bytes

    def check(self) -> None:
        _tunnel_chunk(self.data)


@dataclass(frozen=True)
class TunnelEof(Reply):
    """The sandbox side half-closed: nothing more comes from it (an answer may still go to it)."""

    TYPE: ClassVar[str] = "tunnel_eof"
    conn: Count


@dataclass(frozen=True)
class TunnelClosed(Reply):
    """The connection is gone on the sandbox side (closed, reset, or closed as the host asked)."""

    TYPE: ClassVar[str] = "tunnel_close"
    conn: Count


@dataclass(frozen=True)
class TunnelWindow(Reply):
    """The agent handed ``credit`` more bytes on to the sandbox: the host may send that many more."""

    TYPE: ClassVar[str] = "tunnel_credit"
    conn: Count
    credit: Count

    def check(self) -> None:
        _credit(self.credit, SANDBOX_WINDOW)


@dataclass(frozen=True)
class TunnelListen(Request[Listening], op="tunnel_listen", reply=Listening):
    """Listen on ``127.0.0.1:port`` (0: any free port) for the sandbox's proxy connections.

    Answered with ``listening``, then the frames of every connection, on this request's id, for
    the agent's life. From then on every command's environment names the proxy (``HTTP_PROXY``
    and its kin, ``NO_PROXY``) and carries ``env`` (the extra CA bundle's variables).
    """

    port: Count
    env: Env = field(default_factory=dict)

    def check(self) -> None:
        if self.port > 65535:
            raise BadMessage("port out of range")
        check_env(self.env)


@dataclass(frozen=True)
class TunnelConnect(Request[TunnelOpened], op="tunnel_connect", reply=TunnelOpened):
    """Connect to ``127.0.0.1:port`` in the sandbox (never another address: the host names a port,
    not a place). Answered with ``tunnel_open`` (or an ``error``: ``ECONNREFUSED``, ``too_many``),
    then that connection's frames on this request's id until its ``tunnel_close``."""

    port: Count

    def check(self) -> None:
        if not 0 < self.port <= 65535:
            raise BadMessage("port out of range")


@dataclass(frozen=True)
class TunnelShut(Request[Done], op="tunnel_shut", reply=Done):
    """The host half-closed a connection: once what was sent to it is written, the agent shuts its
    socket for writing and goes on reading; never answered."""

    conn: Count


@dataclass(frozen=True)
class TunnelSend(Request[Done], op="tunnel_data", reply=Done):
    """Bytes for a connection, within the window the agent granted; never answered."""

    conn: Count
    data: bytes

    def check(self) -> None:
        _tunnel_chunk(self.data)


@dataclass(frozen=True)
class TunnelClose(Request[Done], op="tunnel_close", reply=Done):
    """Close a connection once what was sent to it is written; never answered."""

    conn: Count


@dataclass(frozen=True)
class TunnelCredit(Request[Done], op="tunnel_credit", reply=Done):
    """The host handed ``credit`` more bytes of a connection on: the agent may send that many more."""

    conn: Count
    credit: Count

    def check(self) -> None:
        _credit(self.credit, HOST_WINDOW)
