"""The host's side of ``tunnel_connect`` (``ports.PortConnection`` on the link) against a hostile
agent: an error answer is a ``PortError`` naming the port, frames of another connection or before
the open break the link, a connection the agent closed frees its request id, and a broken link
fails a connect still waiting."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.core.sandbox_api import PortError, PortStream, SandboxError
from dispatcher.sandbox.agent.protocol import HOST_WINDOW
from dispatcher.sandbox.channel import AgentChannel
from tests.unit.sandbox.channel_rig import FakeAgent


async def _connect(
    channel: AgentChannel, fake: FakeAgent, port: int
) -> tuple[asyncio.Future[PortStream], int]:
    pending = asyncio.ensure_future(channel.connect_port(port))
    request = await fake.request()
    assert request == {"id": request["id"], "op": "tunnel_connect", "port": port}
    return pending, request["id"]


async def test_an_error_answer_is_a_port_error_naming_the_port(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    pending, rid = await _connect(channel, fake, 8000)
    fake.reply({"id": rid, "type": "error", "code": "ECONNREFUSED", "message": "Connection refused"})
    with pytest.raises(PortError) as err:
        await pending
    assert err.value.code == "refused" and "nothing listens on port 8000" in str(err.value)
    pending, rid = await _connect(channel, fake, 8001)
    fake.reply({"id": rid, "type": "error", "code": "too_many", "message": "256 open"})
    with pytest.raises(PortError) as err:
        await pending
    assert err.value.code == "too_many"
    assert not channel.broken


async def test_bytes_both_ways_and_the_close_frees_the_request(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    pending, rid = await _connect(channel, fake, 8000)
    fake.reply({"id": rid, "type": "tunnel_open", "conn": 4})
    stream = await pending
    fake.reply({"id": rid, "type": "tunnel_data", "conn": 4}, b"hello")
    assert await stream.read(100) == b"hello"
    await stream.write(b"abc")
    sent = await fake.request()
    assert (sent["op"], sent["conn"]) == ("tunnel_data", 4)
    await stream.shut_write()
    assert (await fake.request())["op"] == "tunnel_shut"
    fake.reply({"id": rid, "type": "tunnel_eof", "conn": 4})
    assert await stream.read(100) == b""
    fake.reply({"id": rid, "type": "tunnel_close", "conn": 4})
    fake.reply({"id": rid, "type": "tunnel_data", "conn": 4}, b"late")  # a late frame: ignored
    await asyncio.sleep(0)
    assert not channel.broken


@pytest.mark.parametrize(
    "frame",
    [
        ({"type": "tunnel_data", "conn": 5}, b"x"),  # another connection's
        ({"type": "tunnel_open", "conn": 6}, b""),  # opened twice
        ({"type": "tunnel_data", "conn": 4}, b"x" * (HOST_WINDOW + 1)),  # beyond its window
    ],
)
async def test_frames_that_break_the_protocol_break_the_link(
    channel: AgentChannel, fake: FakeAgent, frame: tuple[dict[str, object], bytes]
) -> None:
    pending, rid = await _connect(channel, fake, 8000)
    fake.reply({"id": rid, "type": "tunnel_open", "conn": 4})
    stream = await pending
    header, payload = frame
    if len(payload) > HOST_WINDOW:  # two chunks within bounds, more than the window together
        half = HOST_WINDOW // 2 + 1
        fake.reply({"id": rid, **header}, payload[:half])
        fake.reply({"id": rid, **header}, payload[half : 2 * half])
    else:
        fake.reply({"id": rid, **header}, payload)
    await asyncio.wait_for(_broken(channel), 5)
    assert await stream.read(10) == b""


async def _broken(channel: AgentChannel) -> None:
    while not channel.broken:
        await asyncio.sleep(0.01)


async def test_a_frame_before_the_open_breaks_the_link_and_fails_the_connect(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    pending, rid = await _connect(channel, fake, 8000)
    fake.reply({"id": rid, "type": "tunnel_data", "conn": 1}, b"x")
    with pytest.raises(SandboxError):
        await pending


async def test_a_port_out_of_range_is_refused_before_anything_is_sent(channel: AgentChannel) -> None:
    for port in (0, 65536):
        with pytest.raises(PortError) as err:
            await channel.connect_port(port)
        assert err.value.code == "bad_port"
