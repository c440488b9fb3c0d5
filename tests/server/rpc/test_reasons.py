"""Issue 22 item 4 through gRPC: ``ToolResult.reason`` and ``ToolFailed.reason`` tell denials and
failures apart within spec 000's closed error classes (spec 003 §2's slugs among them)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.dispatcher import Decision
from dispatcher.core.errors import FailureReason
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.events import EventOf, ToolConfirmationRequested, ToolFailed, ToolOutputDelta, events_of
from tests.server.conftest import Harness, ServerFactory
from tests.server.helpers import next_event

Item = Event | ToolResultBlock


@pytest.fixture
async def server(make_server: ServerFactory) -> Harness:
    """Shell and writes run unasked, ``block`` is denied by the policy, requests show 2,000 chars."""
    return await make_server(
        tool_confirmation={"default": {"WRITE": "auto", "EXECUTE": "auto"}, "per_tool": {"block": "deny"}},
        dispatcher={"confirmation_max_chars": 2_000},
    )


async def _call(
    client: AsyncDispatcherClient, session_id: str, name: str, tool_input: Any
) -> tuple[ToolResultBlock, list[Event]]:
    items: list[Item] = [i async for i in client.dispatch(session_id, [ToolUseBlock("tu", name, tool_input)])]
    (result,) = [i for i in items if isinstance(i, ToolResultBlock)]
    return result, [i for i in items if isinstance(i, Event)]


def _failed(events: list[Event]) -> EventOf[ToolFailed]:
    (failed,) = events_of(events, ToolFailed)
    return failed


@pytest.mark.parametrize(
    ("name", "tool_input", "error_class", "reason"),
    [
        ("no_such_tool", {}, "not_found", "tool_not_found"),
        ("echo", {"txt": "x"}, "validation_error", "invalid_args"),
        ("echo", "{not json", "validation_error", "invalid_args"),
        ("read_file", {"path": "../outside.txt"}, "permission_denied", "workspace_escape"),
        ("block", {}, "permission_denied", "policy_denied"),
        ("shell", {"command": "exit 3"}, "execution_error", "tool_failed"),
        ("shell", {"command": "sleep 30", "timeout_seconds": 0.2}, "timeout", "timeout"),
    ],
)
async def test_reason_of_each_failure(
    server: Harness, name: str, tool_input: Any, error_class: str, reason: str
) -> None:
    client = server.client()
    info = await client.create_session("reasons")
    result, events = await _call(client, info.session_id, name, tool_input)
    assert result.is_error and result.error_class == error_class and result.reason == reason
    if error_class != "validation_error":  # that one is tool.input_invalid
        assert _failed(events).payload.reason == reason


async def test_success_has_no_reason(server: Harness) -> None:
    client = server.client()
    info = await client.create_session("ok")
    result, _ = await _call(client, info.session_id, "echo", {"text": "hi"})
    assert not result.is_error and result.reason == ""


async def test_capability_and_fs_denials_differ(server: Harness) -> None:
    client = server.client()
    info = await client.create_session("caps", tools=["read_file", "echo"], fs=[("src", "rw")])
    result, events = await _call(client, info.session_id, "list_dir", {"path": "."})
    assert (result.error_class, result.reason) == ("permission_denied", "capability_denied")
    result, events = await _call(client, info.session_id, "read_file", {"path": "other.txt"})
    assert (result.error_class, result.reason) == ("permission_denied", "fs_denied")
    assert _failed(events).payload.reason == "fs_denied"


async def test_a_plan_hold_is_not_a_user_denial(server: Harness) -> None:
    client = server.client()
    info = await client.create_session("plan", mode="plan")
    result, events = await _call(client, info.session_id, "shell", {"command": "make"})
    assert (result.error_class, result.reason) == ("user_denied", "plan_proposed")
    assert _failed(events).payload.reason == "plan_proposed"


async def test_user_denied_then_remembered_deny(server: Harness) -> None:
    client = server.client()
    info = await client.create_session("manual", mode="manual")  # every call asks
    call = asyncio.ensure_future(_call(client, info.session_id, "echo", {"text": "x"}))
    request = await next_event(client, info.session_id, ToolConfirmationRequested)
    await client.resolve_confirmation(
        info.session_id, str(request.payload.request_id), Decision.DENY, remember=True
    )
    result, _ = await call
    assert (result.error_class, result.reason) == ("user_denied", "user_denied")
    result, _ = await _call(client, info.session_id, "echo", {"text": "again"})
    assert (result.error_class, result.reason) == ("user_denied", "remembered_deny")


async def test_too_long_to_confirm(server: Harness) -> None:
    client = server.client()
    info = await client.create_session("long", mode="manual")
    result, _ = await _call(client, info.session_id, "echo", {"text": "x" * 5_000})
    assert (result.error_class, result.reason) == ("permission_denied", "too_long_to_confirm")


async def test_cancelled(server: Harness) -> None:
    client = server.client()
    info = await client.create_session("cancel")
    call = asyncio.ensure_future(_call(client, info.session_id, "shell", {"command": "echo go; sleep 30"}))
    await next_event(client, info.session_id, ToolOutputDelta)
    await client.cancel(info.session_id)
    result, events = await call
    assert (result.error_class, result.reason) == ("cancelled", "cancelled")
    assert _failed(events).payload.reason == "cancelled"


async def test_confirmation_timeout(make_server: ServerFactory) -> None:
    server = await make_server(dispatcher={"confirmation_timeout": 0.2})
    client = server.client()
    info = await client.create_session("slow-human", mode="manual")
    result, _ = await _call(client, info.session_id, "echo", {"text": "x"})
    assert (result.error_class, result.reason) == ("confirmation_timeout", "confirmation_timeout")


def test_the_closed_list_is_what_the_proto_documents() -> None:
    from pathlib import Path

    proto = (Path(__file__).parents[3] / "proto/dispatcher/v1/dispatcher.proto").read_text()
    documented = proto.split("string reason = 8;")[0].rsplit("// Why the call failed", 1)[1]
    for reason in FailureReason:
        assert reason.value in documented, reason
