"""Spec 000's worked examples, end to end over gRPC with the built-in tools on the local sandbox."""

from __future__ import annotations

import asyncio
import time

from dispatcher.core.dispatcher import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.types import SideEffect, ToolResultBlock, ToolUseBlock
from tests.events import (
    ToolCalled,
    ToolConfirmationRequested,
    ToolConfirmationResolved,
    ToolFailed,
    ToolOutputDelta,
    event_of,
    events_of,
    is_event,
)
from tests.server.conftest import Harness
from tests.server.helpers import next_event, text_of


async def test_read_a_file(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    (harness.tmp / "ws-alpha" / "default" / "README.md").write_text("# Project Foo\nhello\n")
    items = [
        i
        async for i in client.dispatch(
            session.session_id, [ToolUseBlock("tu_01HZ_a", "read_file", {"path": "README.md"})]
        )
    ]
    events = [i for i in items if isinstance(i, Event)]
    assert [e.type for e in events] == ["tool.called", "tool.completed"]
    assert event_of(events[0], ToolCalled).payload.side_effect is SideEffect.READ
    result = items[-1]
    assert isinstance(result, ToolResultBlock) and result.tool_use_id == "tu_01HZ_a"
    assert not result.is_error and "# Project Foo" in text_of(result)


async def test_workspace_escape_is_refused(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    items = [
        i
        async for i in client.dispatch(
            session.session_id, [ToolUseBlock("tu_01HZ_b", "read_file", {"path": "../../etc/passwd"})]
        )
    ]
    result = items[-1]
    assert isinstance(result, ToolResultBlock)
    assert result.is_error and str(result.error_class) == "permission_denied"
    assert "root:" not in text_of(result)
    failed = events_of(items, ToolFailed)
    assert failed and str(failed[0].payload.error_class) == "permission_denied"


async def test_write_denied_by_a_second_client(harness: Harness) -> None:
    agent, human = harness.client(), harness.client()
    session = await agent.create_session()
    stream = agent.dispatch(
        session.session_id, [ToolUseBlock("tu_01HZ_c", "write_file", {"path": "src/auth.ts", "content": "x"})]
    )
    collected = asyncio.create_task(_collect(stream))
    request = await next_event(human, session.session_id, ToolConfirmationRequested)
    assert request.payload.tool_name == "write_file"
    assert request.payload.projected_modifications == ("src/auth.ts",)
    assert request.payload.side_effect is SideEffect.WRITE
    applied = await human.resolve_confirmation(
        session.session_id, str(request.payload.request_id), Decision.DENY
    )
    assert applied == (True, Decision.DENY)
    items = await asyncio.wait_for(collected, 20)
    kinds = [i.type for i in items if isinstance(i, Event)]
    assert kinds == ["tool.confirmation_requested", "tool.confirmation_resolved", "tool.failed"]
    resolved = next(i for i in items if is_event(i, ToolConfirmationResolved))
    assert resolved.payload.decision is Decision.DENY and resolved.payload.reason == "client"
    result = items[-1]
    assert isinstance(result, ToolResultBlock)
    assert result.is_error and str(result.error_class) == "user_denied"
    assert "denied" in text_of(result).lower()
    assert not (harness.tmp / "ws-alpha" / "default" / "src" / "auth.ts").exists()


async def test_shell_cancelled_mid_run_keeps_partial_output(harness: Harness) -> None:
    agent, human = harness.client(), harness.client()
    session = await agent.create_session()
    stream = agent.dispatch(
        session.session_id,
        [ToolUseBlock("tu_01HZ_d", "shell", {"command": "echo started; sleep 30; echo never"})],
    )
    collected = asyncio.create_task(_collect(stream))
    delta = await next_event(human, session.session_id, ToolOutputDelta)
    assert "started" in str(delta.payload.text)
    began = time.monotonic()
    await human.cancel(session.session_id)
    items = await asyncio.wait_for(collected, 10)
    assert time.monotonic() - began < 5
    result = items[-1]
    assert isinstance(result, ToolResultBlock)
    assert result.is_error and str(result.error_class) == "cancelled"
    assert "started" in text_of(result) and "never" not in text_of(result)
    failed = events_of(items, ToolFailed)
    assert str(failed[0].payload.error_class) == "cancelled"
    assert "started" in str(failed[0].payload.partial_output)


async def test_three_reads_in_parallel(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    for name in "abc":
        (harness.tmp / "ws-alpha" / "default" / f"{name}.txt").write_text(f"content {name}\n")
    uses = [
        ToolUseBlock(f"tu_01HZ_{x}", "read_file", {"path": f"{n}.txt"})
        for x, n in zip("efg", "abc", strict=True)
    ]
    items = [i async for i in client.dispatch(session.session_id, uses)]
    results = {i.tool_use_id: i for i in items if isinstance(i, ToolResultBlock)}
    assert len([i for i in items if isinstance(i, ToolResultBlock)]) == 3
    for x, n in zip("efg", "abc", strict=True):
        assert not results[f"tu_01HZ_{x}"].is_error
        assert text_of(results[f"tu_01HZ_{x}"]).strip() == f"content {n}"
    called = events_of(items, ToolCalled)
    assert len(called) == 3


async def test_shell_result_carries_exit_code(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    ok = await client.call(session.session_id, "shell", {"command": "printf hi"})
    assert not ok.is_error and ok.metadata["exit_code"] == 0 and "hi" in text_of(ok)
    assert ok.command_executed == "printf hi"
    bad = await client.call(session.session_id, "shell", {"command": "echo oops >&2; exit 3"})
    assert bad.is_error and str(bad.error_class) == "execution_error"
    assert bad.metadata["exit_code"] == 3 and "oops" in text_of(bad)


async def _collect(stream: object) -> list[object]:
    return [i async for i in stream]  # type: ignore[attr-defined]
