"""AgentChannel's process calls against a scripted agent: the agent's records become the core's
types, its refusals ``ProcessError``s a model can act on, and a watch is bounded for a consumer
that does not read (it is ended and begun again from where the consumer is, nothing lost)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.core.errors import FailureReason, ToolValidationError
from dispatcher.core.process_api import OutputChunk, ProcessError, ProcessInfo, ProcessStart, ShellState
from dispatcher.core.sandbox_api import ExecRequest, SandboxError
from dispatcher.sandbox.agent.protocol import (
    CHUNK,
    PROTOCOL_VERSION,
    Error,
    ProcChunk,
    ProcData,
    ProcInfo,
    ProcOutput,
    encode_reply,
)
from dispatcher.sandbox.channel import AgentChannel
from tests.unit.sandbox.channel_rig import FakeAgent

RECORD = ProcInfo(
    "p_1", "sleep 9", ".", 41, "running", None, None, 1.5, None, "toolu_1", 0, 0, 1 << 20, True, "background"
)


def _send(fake: FakeAgent, rid: int, reply: Any) -> None:
    fake.reader.feed_data(encode_reply(rid, reply))


async def _answer(fake: FakeAgent, reply: Any) -> dict[str, Any]:
    request = await fake.request()
    _send(fake, request["id"], reply)
    return request


async def test_start_list_read_map_the_agent_records(channel: AgentChannel, fake: FakeAgent) -> None:
    start = asyncio.ensure_future(
        channel.start_process(ProcessStart("p_1", "sleep 9", env={"A": "1"}, tool_use_id="toolu_1"))
    )
    sent = await _answer(fake, RECORD)
    assert (sent["op"], sent["process_id"], sent["env"], sent["tool_use_id"]) == (
        "proc_start",
        "p_1",
        {"A": "1"},
        "toolu_1",
    )
    info = await start
    assert info == ProcessInfo(
        "p_1",
        "sleep 9",
        ".",
        41,
        "running",
        None,
        None,
        1.5,
        None,
        "toolu_1",
        0,
        0,
        1 << 20,
        True,
        "background",
    )
    assert info.running

    listing = asyncio.ensure_future(channel.list_processes())
    request = await fake.request()
    ended = dataclasses.replace(RECORD, process_id="p_0", state="exited", exit_code=0, ended=2.0)
    fake.reply(
        {"id": request["id"], "type": "result"},
        b"[" + b",".join(_json(r) for r in (ended, RECORD)) + b"]",
    )
    assert [(p.process_id, p.state, p.exit_code) for p in await listing] == [
        ("p_0", "exited", 0),
        ("p_1", "running", None),
    ]

    read = asyncio.ensure_future(channel.read_process("p_1", after=10, wait_seconds=2, max_bytes=100))
    reply = ProcOutput(
        (ProcChunk("stdout", 14, b"ab"), ProcChunk("stderr", 16, b"c")), 17, 4, "running", None, None
    )
    sent = await _answer(fake, reply)
    assert (sent["op"], sent["after"], sent["wait_seconds"], sent["max_bytes"]) == ("proc_read", 10, 2, 100)
    output = await read
    assert output.chunks == (OutputChunk("stdout", 14, b"ab"), OutputChunk("stderr", 16, b"c"))
    assert (output.next, output.lost, output.state) == (17, 4, "running")


def _json(record: ProcInfo) -> bytes:
    return json.dumps(record.encode()[0]).encode()


async def test_a_read_is_held_to_the_agents_bounds(channel: AgentChannel, fake: FakeAgent) -> None:
    read = asyncio.ensure_future(
        channel.read_process("p_1", after=-5, wait_seconds=10_000, max_bytes=1 << 30)
    )
    sent = await _answer(fake, ProcOutput((), 0, 0, "running", None, None))
    assert (sent["after"], sent["wait_seconds"], sent["max_bytes"]) == (0, 600.0, 1 << 20)
    await read


@pytest.mark.parametrize(
    ("code", "message", "expected_code", "words"),
    [
        ("too_many", "32 processes are running, the most a session may run", "too_many", "32 processes are running in this session, the most it allows; stop one with process_stop (process_list shows them)"),
        ("no_process", "no process p_1", "no_process", "no process 'p_1' in this session"),
        ("conflict", "process p_1 exists and runs another command", "conflict", "under another id"),
        ("not_running", "process p_1 takes no more input", "not_running", "it ended or its stdin was closed"),
        ("too_large", "an output ring of 99 bytes is more than 9", "too_large", "smaller output ring"),
        ("proc_limit", "no process for a command", "too_many", "process limit is full"),
    ],
)  # fmt: skip
async def test_refusals_are_process_errors_a_model_can_act_on(
    channel: AgentChannel, fake: FakeAgent, code: str, message: str, expected_code: str, words: str
) -> None:
    start = asyncio.ensure_future(channel.start_process(ProcessStart("p_1", "true")))
    request = await fake.request()
    fake.reply({"id": request["id"], "type": "error", "code": code, "message": message, "processes": 3})
    with pytest.raises(ProcessError) as caught:
        await start
    assert caught.value.code == expected_code and words in str(caught.value)
    if expected_code in ("too_many", "too_large"):
        assert caught.value.reason is FailureReason.QUOTA
    assert not channel.broken  # a refusal, not a broken agent


async def test_an_input_past_the_bound_says_what_to_do(channel: AgentChannel, fake: FakeAgent) -> None:
    write = asyncio.ensure_future(channel.write_process_input("p_1", b"x" * 10, close=True))
    request = await fake.request()
    assert (request["op"], request["close"]) == ("proc_input", True)
    fake.reply({"id": request["id"], "type": "error", "code": "too_large", "message": "p_1 has 9 bytes"})
    with pytest.raises(ProcessError, match="wait until it read what it has") as caught:
        await write
    assert caught.value.code == "too_large"
    with pytest.raises(ProcessError, match="send it in parts"):  # more than one frame: not sent
        await channel.write_process_input("p_1", b"x" * ((1 << 20) + 1))


async def test_malformed_requests_are_refused_before_they_are_sent(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    with pytest.raises(ProcessError) as caught:
        await channel.read_process("no such/id")
    assert caught.value.code == "no_process"
    with pytest.raises(ToolValidationError, match="malformed"):
        await channel.start_process(ProcessStart("bad id", "true"))
    with pytest.raises(ToolValidationError, match="signal 'STOP'"):
        await channel.signal_process("p_1", "STOP")
    with pytest.raises(ToolValidationError, match="NUL"):
        await channel.start_process(ProcessStart("p_1", "echo \x00"))
    assert fake.requests.empty()


async def test_a_stop_sends_the_grace(channel: AgentChannel, fake: FakeAgent) -> None:
    stop = asyncio.ensure_future(channel.signal_process("p_1", "TERM", grace_seconds=5000))
    sent = await _answer(fake, dataclasses.replace(RECORD, state="killed", signal=15, ended=3.0))
    assert (sent["op"], sent["signal"], sent["grace_seconds"]) == ("proc_signal", "TERM", 600.0)
    assert (await stop).state == "killed"


async def test_exec_passes_leave_as_and_capture_state_and_maps_the_exit(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    request = ExecRequest("cd sub && export A=1 && sleep 9 &", timeout=5, leave_as="p_7", capture_state=True)
    run = asyncio.ensure_future(channel.exec(request, lambda *_: None, asyncio.Event()))
    sent = await fake.request()
    assert (sent["leave_as"], sent["capture_state"]) == ("p_7", True)
    fake.reply(
        {"id": sent["id"], "type": "exit", "exit_code": 0, "signal": None, "left": ["p_7"], "cwd": "sub",
         "unset": ["OLD"], "env": True},
        b'{"A": "1"}',
    )  # fmt: skip
    result = await run
    assert result.left == ("p_7",)
    assert result.shell_state == ShellState("sub", {"A": "1"}, ("OLD",))

    plain = asyncio.ensure_future(
        channel.exec(ExecRequest("true", timeout=5), lambda *_: None, asyncio.Event())
    )
    sent = await fake.request()
    assert "leave_as" not in sent and "capture_state" not in sent
    fake.reply({"id": sent["id"], "type": "exit", "exit_code": 0, "signal": None})
    result = await plain
    assert result.left == () and result.shell_state is None  # nothing known: keep what was


# -- watch -----------------------------------------------------------------------------------


async def _next(stream: AsyncIterator[OutputChunk | ProcessInfo]) -> OutputChunk | ProcessInfo:
    return await asyncio.wait_for(stream.__anext__(), 2.0)


async def test_a_watch_follows_then_ends_with_the_record(channel: AgentChannel, fake: FakeAgent) -> None:
    stream = channel.watch_process("p_1", after=3)
    first = asyncio.ensure_future(_next(stream))
    request = await fake.request()
    assert (request["op"], request["process_id"], request["after"]) == ("proc_watch", "p_1", 3)
    rid = request["id"]
    _send(fake, rid, ProcData("stdout", 5, b"hello", lost=2))  # 3..5 fell out of the ring
    assert await first == OutputChunk("stdout", 5, b"hello", 2)
    _send(fake, rid, ProcData("stderr", 10, b"oops"))
    assert await _next(stream) == OutputChunk("stderr", 10, b"oops")
    _send(fake, rid, dataclasses.replace(RECORD, state="exited", exit_code=0, ended=2.0, end=14))
    end = await _next(stream)
    assert isinstance(end, ProcessInfo) and end.exit_code == 0
    with pytest.raises(StopAsyncIteration):
        await _next(stream)
    assert fake.requests.empty()  # it ended by itself: nothing to unwatch


async def test_closing_a_watch_early_unwatches_it_and_ignores_late_frames(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    stream = channel.watch_process("p_1")
    first = asyncio.ensure_future(_next(stream))
    rid = (await fake.request())["id"]
    _send(fake, rid, ProcData("stdout", 0, b"a"))
    await first
    await stream.aclose()
    unwatch = await fake.request()
    assert (unwatch["op"], unwatch["watch"]) == ("proc_unwatch", rid)
    _send(fake, rid, ProcData("stdout", 1, b"late"))  # sent before the agent saw the unwatch
    _send(fake, rid, RECORD)
    _send(fake, unwatch["id"], Error("x", "y"))  # the unwatch's own answer: nobody waits for it
    assert await _answer_ping(channel, fake)  # the link still works: late frames were ignored
    assert not channel.broken


async def _answer_ping(channel: AgentChannel, fake: FakeAgent) -> bool:
    ping = asyncio.ensure_future(channel.ping(2.0))
    request = await fake.request()
    fake.reply({"id": request["id"], "type": "result", "version": PROTOCOL_VERSION})
    return await ping == PROTOCOL_VERSION


async def test_a_watch_is_bounded_for_a_consumer_that_does_not_read(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    """The consumer takes nothing while 40 frames of 64 KiB come (2.5 MiB) with a 256 KiB bound:
    the host holds at most the bound, ends the agent's watch, and once the consumer took the
    buffer, watches again from the byte after the last it holds; every byte arrives once, in order."""
    limit = 256 << 10
    stream = channel.watch_process("p_1", buffer_bytes=limit)
    first = asyncio.ensure_future(_next(stream))
    rid = (await fake.request())["id"]
    _send(fake, rid, ProcData("stdout", 0, b"\0" * CHUNK))
    await first  # the watch runs; now nobody reads
    for n in range(1, 40):
        _send(fake, rid, ProcData("stdout", n * CHUNK, bytes([n % 256]) * CHUNK))
    unwatch = await fake.request()
    assert (unwatch["op"], unwatch["watch"]) == ("proc_unwatch", rid)
    held = channel._pending.get(rid)  # ended: no longer pending, its frames ignored
    assert held is None
    got: list[OutputChunk] = []
    for _ in range(limit // CHUNK):  # what the buffer held: frames 1..4
        item = await _next(stream)
        assert isinstance(item, OutputChunk)
        got.append(item)
    assert [c.cursor // CHUNK for c in got] == [1, 2, 3, 4]
    resumed = asyncio.ensure_future(_next(stream))
    again = await fake.request()
    assert (again["op"], again["after"]) == ("proc_watch", 5 * CHUNK)  # from the consumer's cursor
    # The ring had dropped 2 frames meanwhile: the new watch says so, exactly.
    _send(fake, again["id"], ProcData("stdout", 7 * CHUNK, b"\7" * CHUNK, lost=2 * CHUNK))
    item = await resumed
    assert isinstance(item, OutputChunk) and (item.cursor, item.lost) == (7 * CHUNK, 2 * CHUNK)
    await stream.aclose()


async def test_a_watch_frame_out_of_order_breaks_the_channel(channel: AgentChannel, fake: FakeAgent) -> None:
    stream = channel.watch_process("p_1", after=0)
    first = asyncio.ensure_future(_next(stream))
    rid = (await fake.request())["id"]
    _send(fake, rid, ProcData("stdout", 0, b"ab"))
    await first
    _send(fake, rid, ProcData("stdout", 5, b"cd"))  # a gap with no lost bytes said
    with pytest.raises(SandboxError, match="not contiguous"):
        await _next(stream)
    assert channel.broken


async def test_a_watch_of_an_unknown_process_is_no_process(channel: AgentChannel, fake: FakeAgent) -> None:
    stream = channel.watch_process("p_9")
    first = asyncio.ensure_future(_next(stream))
    request = await fake.request()
    fake.reply({"id": request["id"], "type": "error", "code": "no_process", "message": "no process p_9"})
    with pytest.raises(ProcessError) as caught:
        await first
    assert caught.value.code == "no_process"
