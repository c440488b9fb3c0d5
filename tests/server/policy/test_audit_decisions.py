"""Issue 37 item 4 through a real server and agent: each call's audit record names the decision
that really applied and carries the call's reason slug, refusals before the policy step and the
agent's own refusals included."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.server.conftest import Harness, ServerFactory
from tests.server.policy.test_audit_before_run import records


@pytest.fixture
async def server(make_server: ServerFactory) -> Harness:
    """Shell and writes run unasked, ``block`` is denied by the policy."""
    return await make_server(
        tool_confirmation={"default": {"WRITE": "auto", "EXECUTE": "auto"}, "per_tool": {"block": "deny"}},
    )


async def _result(
    client: AsyncDispatcherClient, session_id: str, tid: str, name: str, tool_input: Any
) -> ToolResultBlock:
    items = [i async for i in client.dispatch(session_id, [ToolUseBlock(tid, name, tool_input)])]
    (result,) = [i for i in items if isinstance(i, ToolResultBlock)]
    return result


def _trail(server: Harness, tid: str) -> list[tuple[str, str, str | None]]:
    mine = [r for r in records(server.tmp / "home") if r.get("tool_use_id") == tid]
    return [(r["kind"], r["decision"], r.get("reason")) for r in mine]


@pytest.mark.parametrize(
    ("name", "tool_input", "decision"),
    [
        ("no_such_tool", {}, "tool_not_found"),
        ("echo", {"txt": "x"}, "invalid_args"),
        ("echo", "{not json", "invalid_args"),
        ("read_file", {"path": "../outside.txt"}, "workspace_escape"),
        ("block", {}, "policy_denied"),
    ],
)
async def test_a_refusal_before_the_call_runs_names_what_refused_it(
    server: Harness, name: str, tool_input: Any, decision: str
) -> None:
    client = server.client()
    info = await client.create_session("refusals")
    result = await _result(client, info.session_id, "tu_r", name, tool_input)
    assert result.is_error and result.reason == decision
    assert _trail(server, "tu_r") == [("tool.call.denied", decision, decision)]


async def test_a_link_out_of_the_workspace_refused_by_the_agent_is_a_denial(server: Harness) -> None:
    # A read runs unasked and no grant narrows the session: the server does not resolve the path
    # before the call (000-14), so the agent is the one to refuse it, after the dispatched record.
    client = server.client()
    info = await client.create_session("link")
    made = await _result(client, info.session_id, "tu_ln", "shell", {"command": "ln -s .. up"})
    assert not made.is_error
    result = await _result(client, info.session_id, "tu_esc", "read_file", {"path": "up/secret.txt"})
    assert result.is_error and result.error_class == "permission_denied"
    assert result.reason == "workspace_escape"
    assert _trail(server, "tu_esc") == [
        ("tool.call.dispatched", "auto", None),
        ("tool.call.denied", "workspace_escape", "workspace_escape"),
    ]
    assert _trail(server, "tu_ln")[-1] == ("tool.call.completed", "auto", "")


async def test_a_failed_run_is_completed_with_its_reason(server: Harness) -> None:
    client = server.client()
    info = await client.create_session("failed")
    await _result(client, info.session_id, "tu_f", "shell", {"command": "exit 3"})
    assert _trail(server, "tu_f") == [
        ("tool.call.dispatched", "auto", None),
        ("tool.call.completed", "auto", "tool_failed"),
    ]
