"""AgentChannel against a scripted fake agent: hostile frames break the channel, never the host."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.sandbox_api import ExecRequest, FileOpError, SandboxError
from dispatcher.sandbox.agent.protocol import CHUNK, PREFIX, encode_frame
from dispatcher.sandbox.channel import MAX_HEADER, AgentChannel, AgentUnresponsive
from tests.unit.sandbox.channel_rig import WAIT, FakeAgent


async def _answer_next(fake: FakeAgent, **fields: Any) -> dict[str, Any]:
    request = await fake.request()
    fake.reply({"id": request["id"], **fields})
    return request


async def test_results_are_matched_by_id(channel: AgentChannel, fake: FakeAgent) -> None:
    first = asyncio.ensure_future(channel.exists("a"))
    second = asyncio.ensure_future(channel.exists("b"))
    r1, r2 = await fake.request(), await fake.request()
    fake.reply({"id": r2["id"], "type": "result", "exists": False})
    fake.reply({"id": r1["id"], "type": "result", "exists": True})
    assert await first is True and await second is False
    assert (r1["path"], r2["path"]) == ("a", "b")


async def test_error_codes_map_to_typed_errors(channel: AgentChannel, fake: FakeAgent) -> None:
    call = asyncio.ensure_future(channel.read("x"))
    await _answer_next(fake, type="error", code="escape", message="x: path escapes the workspace")
    with pytest.raises(WorkspaceEscapeError, match="escapes"):
        await call
    call = asyncio.ensure_future(channel.read("y"))
    await _answer_next(fake, type="error", code="ENOENT", message="y: No such file or directory")
    with pytest.raises(FileOpError) as info:
        await call
    assert info.value.code == "ENOENT"
    assert not channel.broken


async def test_eof_fails_pending_and_future_calls(channel: AgentChannel, fake: FakeAgent) -> None:
    call = asyncio.ensure_future(channel.exists("a"))
    await fake.request()
    fake.reader.feed_eof()
    with pytest.raises(SandboxError, match="closed"):
        await asyncio.wait_for(call, WAIT)
    assert channel.broken
    with pytest.raises(SandboxError):
        await channel.exists("b")


_VIOLATIONS: list[tuple[str, bytes]] = [
    ("oversized header", PREFIX.pack(MAX_HEADER + 1, 0)),
    ("oversized payload", PREFIX.pack(10, (1 << 20) + 1)),
    ("not json", PREFIX.pack(5, 0) + b"{nope"),
    ("not an object", PREFIX.pack(2, 0) + b"[]"),
    ("string id", encode_frame({"id": "1", "type": "result"})),
    ("unknown id", encode_frame({"id": 999, "type": "result"})),
    ("no type", encode_frame({"id": 1})),
    ("unknown type", encode_frame({"id": 1, "type": "surprise"})),
    ("bad error code", encode_frame({"id": 1, "type": "error", "code": "../../x", "message": "m"})),
    ("error without message", encode_frame({"id": 1, "type": "error", "code": "ENOENT"})),
    (
        "agent protocol complaint",
        encode_frame({"id": None, "type": "error", "code": "protocol", "message": "m"}),
    ),
    ("wrong field type", encode_frame({"id": 1, "type": "result", "exists": "yes"})),
]


@pytest.mark.parametrize(("name", "frame"), _VIOLATIONS, ids=[name for name, _ in _VIOLATIONS])
async def test_protocol_violations_break_the_channel(
    channel: AgentChannel, fake: FakeAgent, name: str, frame: bytes
) -> None:
    call = asyncio.ensure_future(channel.exists("a"))
    request = await fake.request()
    assert request["id"] == 1
    fake.reader.feed_data(frame)
    with pytest.raises(SandboxError):
        await asyncio.wait_for(call, WAIT)
    assert channel.broken


@pytest.mark.parametrize(
    "reply",
    [
        {"type": "result", "path": "../etc", "kind": "file", "size": 1, "mode": 420, "mtime": 1.0},
        {"type": "result", "path": "a", "kind": "socket", "size": 1, "mode": 420, "mtime": 1.0},
        {"type": "result", "path": "a", "kind": "file", "size": "1", "mode": 420, "mtime": 1.0},
        {"type": "result", "path": "a", "kind": "file", "size": 1, "mode": 420, "mtime": True},
    ],
)
async def test_malformed_stat_replies_break_the_channel(
    channel: AgentChannel, fake: FakeAgent, reply: dict[str, Any]
) -> None:
    call = asyncio.ensure_future(channel.stat("a"))
    await _answer_next(fake, **reply)
    with pytest.raises(SandboxError, match="violation"):
        await call
    assert channel.broken


async def test_stat_path_is_reported_under_the_workspace_root(channel: AgentChannel, fake: FakeAgent) -> None:
    call = asyncio.ensure_future(channel.stat("sub/../a"))
    await _answer_next(fake, type="result", path="a", kind="file", size=3, mode=0o644, mtime=5)
    st = await call
    assert (st.path, st.kind, st.size, st.mtime) == ("/workspace/a", "file", 3, 5.0)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b'{"a": 1}',
        b'[{"name": "../x", "kind": "file", "size": 1}]',
        b'[{"name": "a", "kind": "dir"}]',
    ],
)
async def test_malformed_listings_break_the_channel(
    channel: AgentChannel, fake: FakeAgent, body: bytes
) -> None:
    call = asyncio.ensure_future(channel.list("."))
    request = await fake.request()
    fake.reply({"id": request["id"], "type": "result", "truncated": False}, body)
    with pytest.raises(SandboxError, match="violation"):
        await call


async def test_listing_longer_than_asked_breaks_the_channel(channel: AgentChannel, fake: FakeAgent) -> None:
    call = asyncio.ensure_future(channel.list(".", limit=1))
    request = await fake.request()
    body = b'[{"name": "a", "kind": "file", "size": 1}, {"name": "b", "kind": "file", "size": 1}]'
    fake.reply({"id": request["id"], "type": "result", "truncated": False}, body)
    with pytest.raises(SandboxError):
        await call


async def test_read_returning_more_than_asked_breaks_the_channel(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    call = asyncio.ensure_future(channel.read_bytes("a", max_bytes=4))
    request = await fake.request()
    assert (request["max_bytes"], request["strict"]) == (4, False)
    fake.reply({"id": request["id"], "type": "result", "size": 10}, b"0123456789")
    with pytest.raises(SandboxError, match="violation"):
        await call


async def test_uncapped_read_asks_for_strict_frame_limit(channel: AgentChannel, fake: FakeAgent) -> None:
    call = asyncio.ensure_future(channel.read_bytes("a"))
    request = await _answer_next(fake, type="result", size=2)
    assert (request["max_bytes"], request["strict"]) == (1 << 20, True)
    assert await call == b""


async def test_oversized_write_is_refused_before_sending(channel: AgentChannel, fake: FakeAgent) -> None:
    with pytest.raises(FileOpError) as info:
        await channel.write_bytes("big", b"x" * ((1 << 20) + 1))
    assert info.value.code == "too_large" and fake.requests.empty()


async def test_a_large_payload_follows_its_head_as_a_write_of_its_own(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    data = bytes(range(256)) * 1024  # not copied onto its head: a tunnel chunk, a file
    call = asyncio.ensure_future(channel.write_bytes("big", data))
    header, payload = await asyncio.wait_for(fake.requests.get(), WAIT)
    assert (header["op"], payload, fake.writes) == ("write", data, 2)
    fake.reply({"id": header["id"], "type": "result"})
    await call
    small = asyncio.ensure_future(channel.write_bytes("small", b"x" * 100))
    header, payload = await asyncio.wait_for(fake.requests.get(), WAIT)
    assert (payload, fake.writes) == (b"x" * 100, 3)  # a small one travels with its head
    fake.reply({"id": header["id"], "type": "result"})
    await small


async def test_late_answer_to_an_abandoned_call_is_ignored(channel: AgentChannel, fake: FakeAgent) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(channel.exists("slow"), 0.05)
    slow = await fake.request()
    fake.reply({"id": slow["id"], "type": "result", "exists": True})
    call = asyncio.ensure_future(channel.exists("b"))
    await _answer_next(fake, type="result", exists=False)
    assert await call is False and not channel.broken


async def test_ping_timeout_raises_agent_unresponsive(channel: AgentChannel) -> None:
    with pytest.raises(AgentUnresponsive):
        await channel.ping(timeout=0.05)
    assert channel.broken


# -- exec -----------------------------------------------------------------------------------


async def test_exec_streams_output_and_returns_exit(channel: AgentChannel, fake: FakeAgent) -> None:
    seen: list[tuple[str, bytes]] = []
    call = asyncio.ensure_future(
        channel.exec(
            ExecRequest("echo hi", timeout=5, env={"A": "1"}, stdin=b"in"),
            lambda stream, data: seen.append((stream, data)),
            asyncio.Event(),
        )
    )
    header, payload = await asyncio.wait_for(fake.requests.get(), WAIT)
    assert (header["op"], header["env"], header["stdin"], payload) == ("exec", {"A": "1"}, True, b"in")
    fake.reply({"id": header["id"], "type": "output", "stream": "stdout"}, b"hi\n")
    fake.reply({"id": header["id"], "type": "exit", "exit_code": 0, "signal": None})
    result = await call
    assert result.exit_code == 0 and not (result.timed_out or result.cancelled or result.killed)
    assert seen == [("stdout", b"hi\n")]


@pytest.mark.parametrize(
    ("frame", "payload"),
    [
        ({"type": "output", "stream": "stdin"}, b"x"),
        ({"type": "output", "stream": "stdout"}, b"x" * (CHUNK + 1)),
        ({"type": "output", "stream": "stdout"}, b""),
        ({"type": "exit", "exit_code": 0, "signal": 9}, b""),
        ({"type": "exit", "exit_code": None, "signal": None}, b""),
        ({"type": "exit", "exit_code": 300, "signal": None}, b""),
        ({"type": "exit", "exit_code": "0", "signal": None}, b""),
        ({"type": "result"}, b""),
    ],
)
async def test_bad_exec_frames_break_the_channel(
    channel: AgentChannel, fake: FakeAgent, frame: dict[str, Any], payload: bytes
) -> None:
    call = asyncio.ensure_future(
        channel.exec(ExecRequest("x", timeout=5), lambda s, d: None, asyncio.Event())
    )
    request = await fake.request()
    fake.reply({"id": request["id"], **frame}, payload)
    with pytest.raises(SandboxError):
        await asyncio.wait_for(call, WAIT)
    assert channel.broken


async def test_timeout_sends_term_then_kill_then_gives_up(channel: AgentChannel, fake: FakeAgent) -> None:
    request = ExecRequest("stubborn", timeout=0.05, grace_seconds=0.05)
    call = asyncio.ensure_future(channel.exec(request, lambda s, d: None, asyncio.Event()))
    started = await fake.request()
    term, kill = await fake.request(), await fake.request()
    assert (term["op"], term["exec_id"], term["signal"]) == ("signal", started["id"], "TERM")
    assert (kill["exec_id"], kill["signal"]) == (started["id"], "KILL")
    with pytest.raises(AgentUnresponsive):
        await asyncio.wait_for(call, WAIT)
    assert channel.broken


async def test_cancel_terminates_and_reports_cancelled(channel: AgentChannel, fake: FakeAgent) -> None:
    cancel = asyncio.Event()
    call = asyncio.ensure_future(channel.exec(ExecRequest("sleep", timeout=60), lambda s, d: None, cancel))
    started = await fake.request()
    cancel.set()
    term = await fake.request()
    assert term["signal"] == "TERM"
    fake.reply({"id": started["id"], "type": "exit", "exit_code": None, "signal": 15})
    result = await asyncio.wait_for(call, WAIT)
    assert result.cancelled and not result.timed_out and not result.killed and result.signal == 15


async def test_already_cancelled_exec_never_starts(channel: AgentChannel, fake: FakeAgent) -> None:
    cancel = asyncio.Event()
    cancel.set()
    result = await channel.exec(ExecRequest("x", timeout=1), lambda s, d: None, cancel)
    assert result.cancelled and fake.requests.empty()


async def test_failing_output_callback_stops_the_command_and_reraises(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    def explode(stream: str, data: bytes) -> None:
        raise RuntimeError("consumer bug")

    call = asyncio.ensure_future(channel.exec(ExecRequest("x", timeout=60), explode, asyncio.Event()))
    started = await fake.request()
    fake.reply({"id": started["id"], "type": "output", "stream": "stdout"}, b"data")
    assert (await fake.request())["signal"] == "TERM"
    fake.reply({"id": started["id"], "type": "exit", "exit_code": None, "signal": 15})
    with pytest.raises(RuntimeError, match="consumer bug"):
        await asyncio.wait_for(call, WAIT)
    assert not channel.broken


async def test_abandoned_exec_is_killed(channel: AgentChannel, fake: FakeAgent) -> None:
    call = asyncio.ensure_future(
        channel.exec(ExecRequest("x", timeout=60), lambda s, d: None, asyncio.Event())
    )
    started = await fake.request()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    kill = await fake.request()
    assert (kill["exec_id"], kill["signal"]) == (started["id"], "KILL")


async def test_close_fails_pending_calls_and_is_idempotent(channel: AgentChannel, fake: FakeAgent) -> None:
    call = asyncio.ensure_future(channel.exists("a"))
    await fake.request()
    await channel.close()
    await channel.close()
    with pytest.raises(SandboxError):
        await call
    assert fake.closed and channel.broken


async def test_answer_racing_a_cancelled_caller_does_not_break_the_channel(
    channel: AgentChannel, fake: FakeAgent
) -> None:
    call = asyncio.ensure_future(channel.exists("a"))
    request = await fake.request()
    fake.reply({"id": request["id"], "type": "result", "exists": True})
    call.cancel()  # in the same tick: the reader delivers to a future that is already cancelled
    with pytest.raises(asyncio.CancelledError):
        await call
    follow_up = asyncio.ensure_future(channel.exists("b"))
    await _answer_next(fake, type="result", exists=False)
    assert await follow_up is False and not channel.broken
