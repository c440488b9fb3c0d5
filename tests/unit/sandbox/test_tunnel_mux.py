"""The host's side of the tunnel frames (``TunnelMux``, ``ChannelTunnel``) against a hostile agent:
every frame is checked against the protocol's bounds (a chunk, a window each way, a connection
that was opened), and credit goes back once per half window read, not per chunk."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.egress.proxy import TunnelStream
from dispatcher.sandbox.agent.protocol import (
    HOST_WINDOW,
    SANDBOX_WINDOW,
    TUNNEL_CHUNK,
    ProtocolError,
    Request,
    TunnelCredit,
    TunnelSend,
)
from dispatcher.sandbox.tunnels import ChannelTunnel, TunnelMux

WAIT = 5.0


class FakeLink:
    """What the mux sends, in order; the served streams as they open."""

    def __init__(self) -> None:
        self.sent: list[Request[Any]] = []
        self.opened: asyncio.Queue[ChannelTunnel] = asyncio.Queue()
        self._done = asyncio.Event()

    def post(self, request: Request[Any]) -> None:
        self.sent.append(request)

    async def send_unanswered(self, request: Request[Any]) -> None:
        self.sent.append(request)

    def violation(self, what: str) -> Exception:
        return ProtocolError(what)

    def tool_use_of(self, exec_id: int | None) -> str | None:
        return None

    async def serve(self, stream: TunnelStream, call: str | None) -> None:
        assert isinstance(stream, ChannelTunnel)
        self.opened.put_nowait(stream)
        await self._done.wait()

    def credits(self) -> list[int]:
        return [r.credit for r in self.sent if isinstance(r, TunnelCredit)]


@pytest.fixture
async def link() -> AsyncIterator[FakeLink]:
    link = FakeLink()
    yield link
    link._done.set()


async def _opened(mux: TunnelMux, link: FakeLink, conn: int = 1) -> ChannelTunnel:
    mux.deliver("tunnel_open", {"conn": conn}, b"")
    return await asyncio.wait_for(link.opened.get(), WAIT)


async def test_a_window_of_full_chunks_is_taken_and_one_byte_more_breaks_the_link(link: FakeLink) -> None:
    mux = TunnelMux(link, link.serve)
    await _opened(mux, link)
    for _ in range(HOST_WINDOW // TUNNEL_CHUNK):
        mux.deliver("tunnel_data", {"conn": 1}, b"d" * TUNNEL_CHUNK)
    with pytest.raises(ProtocolError, match="more data than its window"):
        mux.deliver("tunnel_data", {"conn": 1}, b"d")


@pytest.mark.parametrize(
    ("kind", "header", "payload", "message"),
    [
        ("tunnel_data", {"conn": 1}, b"d" * (TUNNEL_CHUNK + 1), "tunnel data size out of bounds"),
        ("tunnel_data", {"conn": 1}, b"", "tunnel data size out of bounds"),
        ("tunnel_data", {"conn": 7}, b"d", "never opened"),
        ("tunnel_data", {"conn": True}, b"d", "'conn' must be int"),
        ("tunnel_credit", {"conn": 1, "credit": SANDBOX_WINDOW + 1}, b"", "tunnel credit out of bounds"),
        ("tunnel_credit", {"conn": 1, "credit": 0}, b"", "tunnel credit out of bounds"),
        ("tunnel_credit", {"conn": 1, "credit": 1}, b"", "credit beyond its window"),  # none spent yet
        ("tunnel_open", {"conn": 1}, b"", "opened twice"),
        ("surprise", {"conn": 1}, b"", "unexpected 'surprise' frame"),
    ],
)
async def test_hostile_frames_break_the_link(
    link: FakeLink, kind: str, header: dict[str, Any], payload: bytes, message: str
) -> None:
    mux = TunnelMux(link, link.serve)
    await _opened(mux, link)
    with pytest.raises(ProtocolError, match=message):
        mux.deliver(kind, header, payload)


async def test_data_after_the_end_breaks_the_link(link: FakeLink) -> None:
    mux = TunnelMux(link, link.serve)
    await _opened(mux, link)
    mux.deliver("tunnel_eof", {"conn": 1}, b"")
    with pytest.raises(ProtocolError, match="data after its end"):
        mux.deliver("tunnel_data", {"conn": 1}, b"d")


async def test_credit_goes_back_once_per_half_window_read(link: FakeLink) -> None:
    mux = TunnelMux(link, link.serve)
    stream = await _opened(mux, link)
    for _ in range(HOST_WINDOW // TUNNEL_CHUNK):
        mux.deliver("tunnel_data", {"conn": 1}, b"d" * TUNNEL_CHUNK)
    got = 0
    while got < HOST_WINDOW // 2 - 1:
        got += len(await stream.read(min(4096, HOST_WINDOW // 2 - 1 - got)))
    assert link.credits() == []  # not a frame per read, nor per chunk
    got += len(await stream.read(1))
    assert link.credits() == [HOST_WINDOW // 2]
    while got < HOST_WINDOW:
        got += len(await stream.read(TUNNEL_CHUNK))
    assert link.credits() == [HOST_WINDOW // 2, HOST_WINDOW // 2]


async def test_writes_go_out_in_chunks_within_the_agents_credit(link: FakeLink) -> None:
    mux = TunnelMux(link, link.serve)
    stream = await _opened(mux, link)
    data = bytes(range(256)) * (SANDBOX_WINDOW // 256 + 1)  # a window and a bit
    writer = asyncio.ensure_future(stream.write(data))
    await asyncio.sleep(0)
    sent = [r for r in link.sent if isinstance(r, TunnelSend)]
    assert not writer.done() and sum(len(r.data) for r in sent) == SANDBOX_WINDOW
    assert all(len(r.data) <= TUNNEL_CHUNK for r in sent)
    mux.deliver("tunnel_credit", {"conn": 1, "credit": SANDBOX_WINDOW // 2}, b"")
    await asyncio.wait_for(writer, WAIT)
    sent = [r for r in link.sent if isinstance(r, TunnelSend)]
    assert b"".join(r.data for r in sent) == data


async def test_a_chunk_that_fits_is_sent_as_it_is(link: FakeLink) -> None:
    mux = TunnelMux(link, link.serve)
    stream = await _opened(mux, link)
    data = b"c" * TUNNEL_CHUNK
    await asyncio.wait_for(stream.write(data), WAIT)
    (sent,) = [r for r in link.sent if isinstance(r, TunnelSend)]
    assert sent.data is data  # not copied on its way to the channel
