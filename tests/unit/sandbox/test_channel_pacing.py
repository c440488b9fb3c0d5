"""A command's output is read no faster than its reader takes it (issue 37 item 1): while the
output callback hands back a pending future, the link reads nothing more; a command being stopped
no longer waits, so its end is read within its kill sequence."""

from __future__ import annotations

import asyncio

from dispatcher.core.sandbox_api import ExecRequest
from dispatcher.sandbox.channel import AgentChannel
from tests.polling import until
from tests.unit.sandbox.channel_rig import WAIT, FakeAgent

LOOP_TURNS = 50  # enough for the read loop to take every frame already fed, were it reading


async def turns() -> None:
    for _ in range(LOOP_TURNS):
        await asyncio.sleep(0)


async def test_output_whose_reader_is_behind_holds_the_link_until_it_has_room(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    room: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[bytes] = []

    def on_output(stream: str, data: bytes) -> asyncio.Future[None] | None:
        seen.append(data)
        return room if len(seen) == 1 else None

    call = asyncio.ensure_future(channel.exec(ExecRequest("yes", timeout=30), on_output, asyncio.Event()))
    started = await fake.request()
    other = asyncio.ensure_future(channel.exists("a"))  # another call on the same link
    asked = await fake.request()
    fake.reply({"id": started["id"], "type": "output", "stream": "stdout"}, b"one\n")
    fake.reply({"id": started["id"], "type": "output", "stream": "stdout"}, b"two\n")
    fake.reply({"id": asked["id"], "type": "result", "exists": True})
    fake.reply({"id": started["id"], "type": "exit", "exit_code": 0, "signal": None})
    await until(lambda: seen == [b"one\n"])
    await turns()
    assert seen == [b"one\n"] and not other.done() and not call.done()  # nothing more is read
    room.set_result(None)  # the reader caught up
    assert await asyncio.wait_for(other, WAIT) is True
    result = await asyncio.wait_for(call, WAIT)
    assert seen == [b"one\n", b"two\n"] and result.exit_code == 0 and not channel.broken


async def test_a_command_timing_out_while_its_output_waits_is_read_to_its_end(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[bytes] = []

    def on_output(stream: str, data: bytes) -> asyncio.Future[None] | None:
        seen.append(data)
        return never  # the reader never catches up

    request = ExecRequest("yes", timeout=0.05, grace_seconds=WAIT)
    call = asyncio.ensure_future(channel.exec(request, on_output, asyncio.Event()))
    started = await fake.request()
    fake.reply({"id": started["id"], "type": "output", "stream": "stdout"}, b"y\n")
    fake.reply({"id": started["id"], "type": "output", "stream": "stdout"}, b"y\n")
    term = await fake.request()  # the timeout: SIGTERM
    assert term["signal"] == "TERM"
    fake.reply({"id": started["id"], "type": "exit", "exit_code": None, "signal": 15})
    result = await asyncio.wait_for(call, WAIT)
    assert result.timed_out and result.signal == 15 and not result.killed
    assert seen == [b"y\n", b"y\n"] and not channel.broken and not never.done()
