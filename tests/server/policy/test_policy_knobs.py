"""Issue 22 item 7 through gRPC: spec 004's remaining policy knobs. The operator's
``tool_confirmation.always_prompt`` (any tool, every mode, never remembered, shown by ListTools),
``manual`` asking even where ``per_tool`` says auto, and per-mode per-tool overrides
(``tool_confirmation.modes.<mode>.per_tool``, spec 004 ``modeToolPermissions``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.dispatcher import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.events import EventOf, ToolConfirmationRequested
from tests.server.conftest import TOKEN_BETA, ServerFactory, base_config
from tests.server.helpers import next_event, text_of


async def _run(
    client: AsyncDispatcherClient, session_id: str, name: str, tool_input: dict[str, Any], tid: str
) -> tuple[list[str], ToolResultBlock]:
    items = [i async for i in client.dispatch(session_id, [ToolUseBlock(tid, name, tool_input)])]
    (result,) = [i for i in items if isinstance(i, ToolResultBlock)]
    return [i.type for i in items if isinstance(i, Event)], result


async def _answered(
    client: AsyncDispatcherClient,
    session_id: str,
    name: str,
    tool_input: dict[str, Any],
    tid: str,
    *,
    after_seq: int,
    remember: bool = False,
) -> tuple[EventOf[ToolConfirmationRequested], ToolResultBlock]:
    """Run one call that must ask; allow it (remembering if told) and return the request and result."""
    call = asyncio.create_task(_run(client, session_id, name, tool_input, tid))
    request = await next_event(client, session_id, ToolConfirmationRequested, after_seq=after_seq)
    answer = await client.answer(
        session_id, str(request.payload.request_id), Decision.ALLOW, remember=remember
    )
    assert answer.applied and not answer.remembered  # an always-asking tool's answer is never remembered
    _, result = await asyncio.wait_for(call, 20)
    return request, result


async def test_an_operators_always_prompt_tool_asks_in_autonomous_mode_every_time(
    make_server: ServerFactory,
) -> None:
    h = await make_server(tool_confirmation={"always_prompt": ["echo"]})
    client = h.client(TOKEN_BETA)
    s = await client.create_session(mode="autonomous")
    tools = {t.name: t for t in await client.list_tools(s.session_id)}
    assert tools["echo"].always_prompt and not tools["read_file"].always_prompt
    first, result = await _answered(
        client, s.session_id, "echo", {"text": "a"}, "e1", after_seq=0, remember=True
    )
    assert not result.is_error, text_of(result)
    # Asked again: the remembered allow does not apply to it.
    second, result = await _answered(client, s.session_id, "echo", {"text": "b"}, "e2", after_seq=first.seq)
    assert second.payload.request_id != first.payload.request_id and not result.is_error
    # Other tools run unasked, as autonomous says.
    events, result = await _run(client, s.session_id, "read_file", {"path": "nothing.txt"}, "r1")
    assert "tool.confirmation_requested" not in events


async def test_a_tenants_always_prompt_applies_in_audit_mode(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    tenants = base_config(tmp_path)["tenants"]
    tenants[1]["tool_confirmation"] = {"always_prompt": ["list_dir"]}  # beta's
    h = await make_server(tenants=tenants)
    client = h.client(TOKEN_BETA)
    s = await client.create_session(mode="audit")
    assert {t.name for t in await client.list_tools(s.session_id) if t.always_prompt} == {"list_dir"}
    _, result = await _answered(client, s.session_id, "list_dir", {"path": "."}, "l1", after_seq=0)
    assert not result.is_error, text_of(result)
    # Alpha's sessions are not concerned.
    alpha = h.client()
    a = await alpha.create_session(mode="audit")
    assert not any(t.always_prompt for t in await alpha.list_tools(a.session_id))


async def test_manual_mode_asks_even_where_per_tool_says_auto(make_server: ServerFactory) -> None:
    h = await make_server(tool_confirmation={"per_tool": {"echo": "auto"}})
    client = h.client(TOKEN_BETA)
    cautious = await client.create_session("c")
    events, result = await _run(client, cautious.session_id, "echo", {"text": "x"}, "c1")
    assert "tool.confirmation_requested" not in events and not result.is_error
    manual = await client.create_session("m", mode="manual")
    _, result = await _answered(client, manual.session_id, "echo", {"text": "x"}, "m1", after_seq=0)
    assert not result.is_error, text_of(result)


async def test_a_mode_override_wins_over_per_tool_for_sessions_in_that_mode(
    make_server: ServerFactory,
) -> None:
    h = await make_server(
        tool_confirmation={
            "per_tool": {"echo": "auto"},
            "modes": {
                "autonomous": {"per_tool": {"echo": "deny", "write_file": "prompt"}},
                "cautious": {"per_tool": {"write_file": "auto"}},
            },
        }
    )
    client = h.client(TOKEN_BETA)
    auto = await client.create_session("a", mode="autonomous")
    _, result = await _run(client, auto.session_id, "echo", {"text": "x"}, "a1")
    assert result.is_error and result.reason == "policy_denied", text_of(result)
    _, result = await _answered(
        client, auto.session_id, "write_file", {"path": "w.txt", "content": "x"}, "a2", after_seq=0
    )
    assert not result.is_error, text_of(result)
    # In cautious mode the override loosens: the write runs unasked; echo keeps its per_tool auto.
    cautious = await client.create_session("c")
    events, result = await _run(
        client, cautious.session_id, "write_file", {"path": "w.txt", "content": "y"}, "c1"
    )
    assert "tool.confirmation_requested" not in events and not result.is_error, text_of(result)
    events, result = await _run(client, cautious.session_id, "echo", {"text": "x"}, "c2")
    assert not result.is_error


async def test_a_mode_override_never_opens_a_denied_class(make_server: ServerFactory) -> None:
    h = await make_server(
        tool_confirmation={
            "default": {"WRITE": "deny"},
            "modes": {"autonomous": {"per_tool": {"write_file": "auto"}}},
        }
    )
    client = h.client(TOKEN_BETA)
    s = await client.create_session(mode="autonomous")
    _, result = await _run(client, s.session_id, "write_file", {"path": "w.txt", "content": "x"}, "w1")
    assert result.is_error and result.reason == "policy_denied", text_of(result)
