"""Confirmation flows over gRPC: prompt -> allow, prompt_once, remember, timeout, first answer wins."""

from __future__ import annotations

import asyncio

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.dispatcher import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock
from tests.events import ToolConfirmationRequested, ToolConfirmationResolved, events_of
from tests.server.conftest import TOKEN_BETA, Harness, ServerFactory
from tests.server.helpers import next_event, text_of


async def test_prompt_then_allow_runs_the_tool(harness: Harness) -> None:
    agent, human = harness.client(TOKEN_BETA), harness.client(TOKEN_BETA)  # beta: EXECUTE prompts
    session = await agent.create_session()
    call = asyncio.create_task(agent.call(session.session_id, "shell", {"command": "echo allowed"}))
    request = await next_event(human, session.session_id, ToolConfirmationRequested)
    assert request.payload.tool_name == "shell"
    assert "echo allowed" in str(request.payload.input_summary)
    await human.resolve_confirmation(session.session_id, str(request.payload.request_id), Decision.ALLOW)
    result = await asyncio.wait_for(call, 20)
    assert not result.is_error and "allowed" in text_of(result)


async def test_prompt_once_asks_only_the_first_time(make_server: ServerFactory) -> None:
    h = await make_server(tenants=None, tool_confirmation={"per_tool": {"write_file": "prompt_once"}})
    # tenants=None -> the embedded default tenant; its token is in <home>/token
    agent = h.client(token=(h.tmp / "home" / "token").read_text().strip())
    session = await agent.create_session()
    first = asyncio.create_task(_items(agent, session.session_id, "w1", {"path": "a.txt", "content": "1"}))
    request = await next_event(agent, session.session_id, ToolConfirmationRequested)
    await agent.resolve_confirmation(session.session_id, str(request.payload.request_id), Decision.ALLOW)
    assert not _result(await asyncio.wait_for(first, 20)).is_error
    second = await asyncio.wait_for(
        _items(agent, session.session_id, "w2", {"path": "b.txt", "content": "2"}), 20
    )
    assert not _result(second).is_error
    assert "tool.confirmation_requested" not in [i.type for i in second if isinstance(i, Event)]
    # a new session asks again
    other = await agent.create_session("other")
    third = asyncio.create_task(_items(agent, other.session_id, "w3", {"path": "c.txt", "content": "3"}))
    request = await next_event(agent, other.session_id, ToolConfirmationRequested)
    await agent.resolve_confirmation(other.session_id, str(request.payload.request_id), Decision.DENY)
    assert str(_result(await asyncio.wait_for(third, 20)).error_class) == "user_denied"


async def test_remember_approves_the_tool_for_the_session(harness: Harness) -> None:
    agent = harness.client()
    session = await agent.create_session()
    first = asyncio.create_task(_items(agent, session.session_id, "w1", {"path": "a.txt", "content": "1"}))
    request = await next_event(agent, session.session_id, ToolConfirmationRequested)
    await agent.resolve_confirmation(session.session_id, str(request.payload.request_id), True, remember=True)
    assert not _result(await asyncio.wait_for(first, 20)).is_error
    second = await asyncio.wait_for(
        _items(agent, session.session_id, "w2", {"path": "b.txt", "content": "2"}), 20
    )
    assert not _result(second).is_error


async def test_confirmation_timeout(make_server: ServerFactory) -> None:
    h = await make_server(dispatcher={"confirmation_timeout": 0.3})
    agent = h.client()
    session = await agent.create_session()
    items = await asyncio.wait_for(
        _items(agent, session.session_id, "w", {"path": "a.txt", "content": "1"}), 20
    )
    result = _result(items)
    assert result.is_error and str(result.error_class) == "confirmation_timeout"
    resolved = events_of(items, ToolConfirmationResolved)
    assert resolved[0].payload.reason == "timeout" and resolved[0].payload.decision is Decision.DENY
    assert not (h.tmp / "ws-alpha" / "default" / "a.txt").exists()


async def _items(
    client: AsyncDispatcherClient, session_id: str, tool_use_id: str, tool_input: dict[str, str]
) -> list[object]:
    from dispatcher.core.types import ToolUseBlock

    stream = client.dispatch(session_id, [ToolUseBlock(tool_use_id, "write_file", tool_input)])
    return [i async for i in stream]


def _result(items: list[object]) -> ToolResultBlock:
    results = [i for i in items if isinstance(i, ToolResultBlock)]
    assert len(results) == 1
    return results[0]
