"""Hostile input through gRPC: what an approver sees, deep JSON, watch cursors, undecodable bytes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.dispatcher import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.events import EventOf, ToolCalled, ToolConfirmationRequested, ToolInputInvalid, events_of
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness
from tests.server.helpers import next_event, text_of, until

AUTH = (("authorization", f"Bearer {TOKEN_ALPHA}"),)


def audit_records(harness: Harness) -> list[dict[str, Any]]:
    path = harness.tmp / "home" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def ask_and_answer(
    client: AsyncDispatcherClient, session_id: str, command: str, decision: Decision
) -> tuple[EventOf[ToolConfirmationRequested], ToolResultBlock]:
    """Call shell (beta: EXECUTE prompts), answer its confirmation, return the request and the result."""
    call = asyncio.create_task(client.call(session_id, "shell", {"command": command}))
    request = await next_event(client, session_id, ToolConfirmationRequested)
    await client.resolve_confirmation(session_id, str(request.payload.request_id), decision)
    return request, await asyncio.wait_for(call, 20)


def shown_input(request: EventOf[ToolConfirmationRequested]) -> str:
    header, body = str(request.payload.input_summary).split("\n", 1)
    assert header.startswith("shell command, ")
    return body


# --- 2: the approver sees exactly what runs ---------------------------------------------------------


async def test_confirmation_shows_the_command_unredacted_and_audit_redacts_it(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    session = await client.create_session()
    command = "echo build ok password=$(touch /workspace/X)"
    request, result = await ask_and_answer(client, session.session_id, command, Decision.DENY)
    assert shown_input(request) == command and "[REDACTED]" not in str(request.payload.input_summary)
    assert str(result.error_class) == "user_denied"
    record = audit_records(harness)[-1]
    assert record["input"]["command"] == "echo build ok password=[REDACTED] /workspace/X)"


async def test_tool_called_is_redacted_while_the_question_was_not(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    session = await client.create_session()
    request, result = await ask_and_answer(
        client, session.session_id, "echo password=hunter22", Decision.ALLOW
    )
    assert shown_input(request) == "echo password=hunter22"
    assert not result.is_error and "hunter22" in text_of(result)
    called = await next_event(client, session.session_id, ToolCalled)
    assert called.payload.input == {"command": "echo password=[REDACTED]"}


async def test_a_5000_character_command_is_shown_whole(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    session = await client.create_session()
    command = "echo " + " ".join(f"word{i:04d}" for i in range(600))
    assert len(command) > 5_000
    request, _ = await ask_and_answer(client, session.session_id, command, Decision.DENY)
    assert shown_input(request) == command


async def test_bidi_and_carriage_return_are_shown_escaped(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    session = await client.create_session()
    command = "echo safe\r\u202erm -rf ~ #"
    request, _ = await ask_and_answer(client, session.session_id, command, Decision.DENY)
    summary = str(request.payload.input_summary)
    assert shown_input(request) == "echo safe\\r\\u202erm -rf ~ #"
    assert "2 shown escaped" in summary and "\r" not in summary and "\u202e" not in summary


# --- 10: deep JSON is a validation error with its audit record ----------------------------------------


@pytest.mark.parametrize("depth", [900, 989, 5000])
async def test_deeply_nested_input_json_is_a_validation_error(harness: Harness, depth: int) -> None:
    client = harness.client()
    session = await client.create_session()
    raw = '{"text": ' + "[" * depth + "]" * depth + "}"
    items = [i async for i in client.dispatch(session.session_id, [ToolUseBlock("deep", "echo", raw)])]
    (result,) = [i for i in items if isinstance(i, ToolResultBlock)]
    assert result.is_error and str(result.error_class) == "validation_error"
    assert "nested deeper than 64 levels" in text_of(result)
    invalid = events_of(items, ToolInputInvalid)
    assert invalid and invalid[0].tool_use_id == "deep"
    record = audit_records(harness)[-1]
    assert (record["tool_use_id"], record["outcome"]) == ("deep", "validation_error")
    assert (
        text_of(await client.call(session.session_id, "echo", {"text": "still serving"})) == "still serving"
    )


# --- 12: WatchSession never goes below its cursor ----------------------------------------------------


async def test_watch_after_a_future_seq_gets_only_later_events(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    await client.call(session.session_id, "echo", {"text": "before"})
    start = (await client.get_session(session.session_id)).last_event_seq
    seen: list[Event] = []

    async def watch() -> None:
        async for event in client.watch(session.session_id, after_seq=start + 3):
            seen.append(event)

    watcher = asyncio.create_task(watch())
    try:
        for i in range(3):  # two events each: start+1 .. start+6
            await client.call(session.session_id, "echo", {"text": f"x{i}"})
        await until(lambda: any(e.seq == start + 6 for e in seen))
    finally:
        watcher.cancel()
    assert [e.seq for e in seen] == [start + 4, start + 5, start + 6]


# --- 15: undecodable request bytes are INVALID_ARGUMENT ----------------------------------------------

BAD_UTF8 = b"\xff\xfe\xc3("


def _string_field(number: int, data: bytes) -> bytes:
    return bytes([number << 3 | 2, len(data)]) + data


async def _raw_status(
    harness: Harness, method: str, body: bytes, *, stream: bool, metadata: Any = AUTH
) -> Any:
    async with grpc.aio.insecure_channel(harness.target) as channel:
        path = f"/dispatcher.v1.ToolDispatcher/{method}"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            if stream:
                async for _ in channel.unary_stream(path)(body, metadata=metadata):
                    pass
            else:
                await channel.unary_unary(path)(body, metadata=metadata)
        return err.value


async def test_non_utf8_create_session_is_invalid_argument(harness: Harness) -> None:
    err = await _raw_status(harness, "CreateSession", _string_field(1, BAD_UTF8), stream=False)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not parse" in err.details() and "class" not in err.details()


async def test_non_utf8_dispatch_is_invalid_argument(harness: Harness) -> None:
    session = await harness.client().create_session()
    tool_use = pb.ToolUse(id="a", name="echo").SerializeToString() + _string_field(3, BAD_UTF8)
    body = pb.DispatchRequest(session_id=session.session_id).SerializeToString() + _string_field(3, tool_use)
    err = await _raw_status(harness, "Dispatch", body, stream=True)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = await _raw_status(harness, "Dispatch", _string_field(1, BAD_UTF8), stream=True)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_undecodable_bytes_without_a_token_are_still_unauthenticated(harness: Harness) -> None:
    err = await _raw_status(harness, "CreateSession", _string_field(1, BAD_UTF8), stream=False, metadata=())
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_the_cli_prints_the_request_the_same_way(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher import cli

    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_BETA)
    client = harness.client(TOKEN_BETA)
    session = await client.create_session()
    command = "echo one\necho two\u202e\r"
    call = asyncio.create_task(client.call(session.session_id, "shell", {"command": command}))
    request = await next_event(client, session.session_id, ToolConfirmationRequested)
    argv = ["watch", "--server", harness.target, session.session_id]
    watch = asyncio.create_task(asyncio.to_thread(cli.main, argv))
    out = ""

    def printed() -> bool:
        nonlocal out
        out += capsys.readouterr().out
        return "echo two" in out

    await until(printed)
    await client.resolve_confirmation(session.session_id, str(request.payload.request_id), Decision.DENY)
    await asyncio.wait_for(call, 20)
    await client.close_session(session.session_id)
    assert await asyncio.wait_for(watch, 10) == 0
    prefix = f"[{request.seq}] {request.tool_use_id}   | "
    lines = [line.removeprefix(prefix) for line in out.splitlines() if line.startswith(prefix)]
    assert lines == str(request.payload.input_summary).split("\n")
    assert lines[1:] == ["echo one", "echo two\\u202e\\r"] and "\u202e" not in out


# --- 3: big inputs are parsed off the event loop and still work ------------------------------------


async def test_big_inputs_go_through_the_parser_thread(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    text = "passwd." * 150_000  # ~1 MB: parsed on the worker thread
    result = await client.call(session.session_id, "echo", {"text": text})
    assert not result.is_error and text_of(result).startswith("passwd.passwd.")
    deep = '{"text": ' + "[" * 500_000 + "]" * 500_000 + "}"
    result = await client.call(session.session_id, "echo", deep)
    assert str(result.error_class) == "validation_error" and "more than 10,000 JSON values" in text_of(result)
