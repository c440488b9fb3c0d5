"""The agent's side of ``tunnel_connect`` (``agent/tunnels.py``), driven in-process: it connects to
127.0.0.1 only, answers ``tunnel_open`` or the errno, carries bytes both ways with the same frames
as the listener's, honours the host's half-close (the peer reads its end and may still answer),
closes once both sides ended, and refuses past ``MAX_CONNECTS``."""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.sandbox.agent import tunnels as agent_tunnels
from dispatcher.sandbox.agent.protocol import (
    Error,
    Reply,
    TunnelClose,
    TunnelClosed,
    TunnelConnect,
    TunnelData,
    TunnelEof,
    TunnelOpened,
    TunnelSend,
    TunnelShut,
)
from dispatcher.sandbox.agent.tunnels import Tunnels

WAIT = 10.0


class _Commands:
    """The tunnels ask commands only about the listener's connections: none here."""

    def add_env(self, env: Any) -> None:
        raise AssertionError("no listener here")

    def exec_of(self, pids: Any) -> None:
        return None


class Rig:
    def __init__(self) -> None:
        self.replies: queue.Queue[tuple[int | None, Reply]] = queue.Queue()
        self.tunnels = Tunnels(self._send, _Commands())  # type: ignore[arg-type]

    def _send(self, rid: int | None, reply: Reply) -> bool:
        self.replies.put((rid, reply))
        return True

    def next(self) -> tuple[int | None, Reply]:
        return self.replies.get(timeout=WAIT)


@pytest.fixture
def rig() -> Iterator[Rig]:
    rig = Rig()
    yield rig
    rig.tunnels.shutdown()


@pytest.fixture
def server() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock
    sock.close()


def _count_then_answer(server: socket.socket) -> threading.Thread:
    """Accept one connection, read it to its end, answer how much came."""

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            total = 0
            while data := conn.recv(65536):
                total += len(data)
            conn.sendall(b"got %d" % total)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_bytes_both_ways_and_the_hosts_half_close(rig: Rig, server: socket.socket) -> None:
    peer = _count_then_answer(server)
    rig.tunnels.connect(7, TunnelConnect(server.getsockname()[1]))
    rid, opened = rig.next()
    assert rid == 7 and isinstance(opened, TunnelOpened)
    rig.tunnels.data(7, TunnelSend(opened.conn, b"x" * 1000))
    rig.tunnels.shut(7, TunnelShut(opened.conn))
    frames = [rig.next() for _ in range(3)]
    assert all(rid == 7 for rid, _ in frames)
    assert [type(f) for _, f in frames] == [TunnelData, TunnelEof, TunnelClosed]
    data = frames[0][1]
    assert isinstance(data, TunnelData) and data.data == b"got 1000"
    peer.join(WAIT)


def test_a_port_nothing_listens_on_answers_its_errno(rig: Rig) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    rig.tunnels.connect(3, TunnelConnect(free))
    rid, error = rig.next()
    assert rid == 3 and isinstance(error, Error) and error.code == "ECONNREFUSED"
    assert str(free) in error.message


def test_connections_past_the_bound_are_refused(
    rig: Rig, server: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_tunnels, "MAX_CONNECTS", 2)
    port = server.getsockname()[1]
    for rid in (1, 2, 3):
        rig.tunnels.connect(rid, TunnelConnect(port))
    answers = dict(rig.next() for _ in range(3))
    assert isinstance(answers[1], TunnelOpened) and isinstance(answers[2], TunnelOpened)
    refused = answers[3]
    assert isinstance(refused, Error) and refused.code == "too_many"
    # One closed: the next is let in.
    first = answers[1]
    assert isinstance(first, TunnelOpened)
    rig.tunnels.close(1, TunnelClose(first.conn))
    assert isinstance(rig.next()[1], TunnelClosed)
    rig.tunnels.connect(4, TunnelConnect(port))
    assert isinstance(rig.next()[1], TunnelOpened)
