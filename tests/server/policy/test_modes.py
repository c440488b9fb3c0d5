"""Issue 10 through gRPC: per-session approval modes and narrower capabilities (points 1, 2),
remembered answers' events and the remembered deny (point 4), files_modified vs
projected_modifications (point 7). The local sandbox; review's Docker test is in tests/integration."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.config import hash_token
from dispatcher.core.dispatcher import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.events import (
    EventOf,
    ToolConfirmationRequested,
    ToolConfirmationResolved,
    ToolStepProposed,
    events_of,
)
from tests.server.conftest import TOKEN_BETA, TOKEN_TINY, Harness, ServerFactory
from tests.server.helpers import next_event, text_of


async def _items(
    client: AsyncDispatcherClient, session_id: str, name: str, tool_input: dict[str, Any], tid: str = "tu"
) -> list[Event | ToolResultBlock]:
    return [item async for item in client.dispatch(session_id, [ToolUseBlock(tid, name, tool_input)])]


def _result(items: list[Event | ToolResultBlock]) -> ToolResultBlock:
    (result,) = [i for i in items if isinstance(i, ToolResultBlock)]
    return result


def _types(items: list[Event | ToolResultBlock]) -> list[str]:
    return [i.type for i in items if isinstance(i, Event)]


async def _answer_next(
    client: AsyncDispatcherClient,
    session_id: str,
    decision: Decision,
    *,
    after_seq: int = 0,
    remember: bool = False,
) -> EventOf[ToolConfirmationRequested]:
    request = await next_event(client, session_id, ToolConfirmationRequested, after_seq=after_seq)
    await client.resolve_confirmation(
        session_id, str(request.payload.request_id), decision, remember=remember
    )
    return request


# --- point 1: the mode and capabilities of one session -----------------------------------------


async def test_create_session_with_mode_and_narrower_capabilities(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)  # beta: every tool, the whole workspace
    info = await client.create_session(
        "ci", mode="autonomous", tools=["read_file", "write_file", "list_dir"], fs=[("src", "rw"), (".", "r")]
    )
    assert info.approval_mode == "autonomous"
    assert info.capabilities.allowed_tools == frozenset({"read_file", "write_file", "list_dir"})
    assert [(g.prefix, g.mode) for g in info.capabilities.fs_grants or ()] == [("src", "rw"), (".", "r")]
    listed = {s.session_id: s for s in await client.list_sessions()}
    assert listed[info.session_id].approval_mode == "autonomous"
    got = await client.get_session(info.session_id)
    assert got.capabilities == info.capabilities
    names = {t.name for t in await client.list_tools(info.session_id)}
    assert names == {"read_file", "write_file", "list_dir"}
    # Narrowed: shell is not this session's, a write outside src is not granted; inside, no question.
    shell = await client.call(info.session_id, "shell", {"command": "true"})
    assert shell.is_error and str(shell.error_class) == "permission_denied"
    outside = await client.call(info.session_id, "write_file", {"path": "top.txt", "content": "x"})
    assert outside.is_error and str(outside.error_class) == "permission_denied"
    inside = await client.call(info.session_id, "write_file", {"path": "src/a.txt", "content": "x"})
    assert not inside.is_error, text_of(inside)
    # The tenant's other sessions keep the tenant's capabilities and its cautious default.
    other = await client.create_session("interactive")
    assert other.approval_mode == "cautious" and other.capabilities.allowed_tools is None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tools": ["shell"]}, "'shell' is not allowed to this tenant"),
        ({"tools": ["no_such_tool"]}, "no tool named 'no_such_tool'"),
        ({"fs": [("../up", "r")]}, "leaves the workspace"),
        ({"fs": [("/etc", "r")]}, "must be relative"),
    ],
)
async def test_a_session_cannot_widen_its_tenant(
    harness: Harness, kwargs: dict[str, Any], needle: str
) -> None:
    client = harness.client(TOKEN_TINY)  # tiny: read_file, list_dir, echo, block only
    with pytest.raises(RequestFailed) as err:
        await client.create_session(**kwargs)
    assert err.value.code == "INVALID_ARGUMENT" and needle in err.value.details


async def test_read_only_tenant_grants_cannot_be_widened(make_server: ServerFactory) -> None:
    ro = {"id": "ro", "token_sha256": hash_token("ro-token-0123456789"), "fs": [{"path": "src", "mode": "r"}]}
    h = await make_server(tenants=[ro])
    client = h.client("ro-token-0123456789")
    with pytest.raises(RequestFailed) as err:
        await client.create_session(fs=[("src", "rw")])
    assert (
        err.value.code == "INVALID_ARGUMENT" and "more than this tenant's grants allow" in err.value.details
    )
    narrower = await client.create_session(fs=[("src/sub", "r")])
    assert [(g.prefix, g.mode) for g in narrower.capabilities.fs_grants or ()] == [("src/sub", "r")]


async def test_unknown_mode_value_is_invalid_argument(harness: Harness) -> None:
    from dispatcher.v1 import dispatcher_pb2 as pb

    client = harness.client()
    with pytest.raises(RequestFailed) as err:
        await client._unary(client._stub.CreateSession, pb.CreateSessionRequest(approval_mode=99))  # type: ignore[arg-type]
    assert err.value.code == "INVALID_ARGUMENT" and "approval_mode" in err.value.details


# --- point 2: one test per mode --------------------------------------------------------------


async def test_cautious_asks_for_writes_not_reads(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session(mode="cautious")
    read = await _items(client, s.session_id, "list_dir", {})
    assert not _result(read).is_error and "tool.confirmation_requested" not in _types(read)
    write = asyncio.create_task(_items(client, s.session_id, "write_file", {"path": "a", "content": "1"}))
    await _answer_next(client, s.session_id, Decision.ALLOW)
    assert not _result(await asyncio.wait_for(write, 20)).is_error


async def test_autonomous_asks_nothing_but_keeps_the_tenants_denies(make_server: ServerFactory) -> None:
    h = await make_server(tool_confirmation={"per_tool": {"patch_file": "deny"}})
    client = h.client(TOKEN_BETA)
    s = await client.create_session(mode="autonomous")
    for name, tool_input in (("write_file", {"path": "a", "content": "1"}), ("shell", {"command": "true"})):
        items = await asyncio.wait_for(_items(client, s.session_id, name, tool_input), 20)
        assert not _result(items).is_error and "tool.confirmation_requested" not in _types(items)
    denied = await client.call(s.session_id, "patch_file", {"path": "a", "old": "1", "new": "2"})
    assert denied.is_error and str(denied.error_class) == "permission_denied"


async def test_manual_asks_even_for_none_and_read_tools(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session(mode="manual")
    for name, tool_input in (("echo", {"text": "hi"}), ("list_dir", {})):
        after = (await client.get_session(s.session_id)).last_event_seq
        call = asyncio.create_task(_items(client, s.session_id, name, tool_input))
        request = await _answer_next(client, s.session_id, Decision.ALLOW, after_seq=after)
        assert request.payload.tool_name == name
        assert not _result(await asyncio.wait_for(call, 20)).is_error


async def test_plan_proposes_side_effects_and_runs_them_after_approval(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session(mode="plan")
    read = await _items(client, s.session_id, "list_dir", {})
    assert not _result(read).is_error
    held = await _items(client, s.session_id, "write_file", {"path": "plan.txt", "content": "x"}, "w1")
    result = _result(held)
    assert result.is_error and str(result.error_class) == "user_denied"
    assert "plan mode" in text_of(result) and "step 1" in text_of(result)
    assert "tool.called" not in _types(held)
    (proposed,) = events_of(held, ToolStepProposed)
    assert proposed.payload.step == 1 and proposed.payload.projected_modifications == ("plan.txt",)
    shell = _result(await _items(client, s.session_id, "shell", {"command": "touch ran"}, "s1"))
    assert shell.is_error and "step 2" in text_of(shell)
    assert not (harness.tmp / "ws-beta" / "default" / "plan.txt").exists()
    info = await client.get_session(s.session_id)
    assert info.approval_mode == "plan" and [p.tool_name for p in info.plan] == ["write_file", "shell"]

    steps, mode = await client.approve_plan(s.session_id, Decision.ALLOW)
    assert [p.tool_use_id for p in steps] == ["w1", "s1"] and mode == "autonomous"
    info = await client.get_session(s.session_id)
    assert info.approval_mode == "autonomous" and info.plan == ()
    again = await asyncio.wait_for(
        _items(client, s.session_id, "write_file", {"path": "plan.txt", "content": "x"}), 20
    )
    assert not _result(again).is_error and "tool.confirmation_requested" not in _types(again)
    with pytest.raises(RequestFailed) as err:  # no longer in plan mode
        await client.approve_plan(s.session_id)
    assert err.value.code == "FAILED_PRECONDITION"


async def test_plan_rejected_stays_in_plan_mode(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session(mode="plan")
    await _items(client, s.session_id, "write_file", {"path": "p", "content": "x"})
    steps, mode = await client.approve_plan(s.session_id, Decision.DENY)
    assert len(steps) == 1 and mode == "plan"
    held = _result(await _items(client, s.session_id, "write_file", {"path": "p", "content": "x"}))
    assert held.is_error and "step 1" in text_of(held)  # a fresh plan


async def test_audit_runs_everything_unasked_and_records_each_call(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session(mode="audit")
    for name, tool_input in (("write_file", {"path": "a", "content": "1"}), ("list_dir", {})):
        items = await asyncio.wait_for(_items(client, s.session_id, name, tool_input), 20)
        assert not _result(items).is_error and "tool.confirmation_requested" not in _types(items)
        assert _types(items)[0] == "tool.called"
    audit = (harness.tmp / "home" / "audit.jsonl").read_text()
    records = [line for line in audit.splitlines() if s.session_id in line and '"decision": "audit"' in line]
    assert len(records) >= 2, audit[-2000:]


# --- point 4: remembered answers -----------------------------------------------------------------


async def test_a_remembered_allow_publishes_why_it_ran(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session()
    first = asyncio.create_task(_items(client, s.session_id, "write_file", {"path": "a", "content": "1"}))
    await _answer_next(client, s.session_id, Decision.ALLOW, remember=True)
    assert not _result(await asyncio.wait_for(first, 20)).is_error
    second = await asyncio.wait_for(
        _items(client, s.session_id, "write_file", {"path": "b", "content": "2"}), 20
    )
    assert not _result(second).is_error
    (resolved,) = events_of(second, ToolConfirmationResolved)
    assert resolved.payload.reason == "remembered" and resolved.payload.decision is Decision.ALLOW
    assert resolved.payload.request_id == "" and "tool.confirmation_requested" not in _types(second)


async def test_a_remembered_deny_refuses_later_calls_without_asking(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session()
    first = asyncio.create_task(_items(client, s.session_id, "shell", {"command": "touch x"}))
    await _answer_next(client, s.session_id, Decision.DENY, remember=True)
    assert str(_result(await asyncio.wait_for(first, 20)).error_class) == "user_denied"
    second = await asyncio.wait_for(_items(client, s.session_id, "shell", {"command": "touch y"}), 20)
    result = _result(second)
    assert result.is_error and str(result.error_class) == "user_denied" and "remember" in text_of(result)
    assert "tool.confirmation_requested" not in _types(second) and "tool.called" not in _types(second)
    (resolved,) = events_of(second, ToolConfirmationResolved)
    assert resolved.payload.reason == "remembered" and resolved.payload.decision is Decision.DENY
    # Only that tool: another one still asks.
    after = (await client.get_session(s.session_id)).last_event_seq
    other = asyncio.create_task(_items(client, s.session_id, "write_file", {"path": "a", "content": "1"}))
    await _answer_next(client, s.session_id, Decision.ALLOW, after_seq=after)
    assert not _result(await asyncio.wait_for(other, 20)).is_error


# --- point 7: one form for paths -----------------------------------------------------------------


async def test_files_modified_and_projected_modifications_use_the_same_form(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)
    s = await client.create_session()
    call = asyncio.create_task(
        _items(client, s.session_id, "write_file", {"path": "./src//x/../a.txt", "content": "1"})
    )
    request = await _answer_next(client, s.session_id, Decision.ALLOW)
    result = _result(await asyncio.wait_for(call, 20))
    assert not result.is_error, text_of(result)
    assert list(result.files_modified) == list(request.payload.projected_modifications) == ["src/a.txt"]


# --- review -----------------------------------------------------------------------------------
# Review and audit modes stage their writes (issue 22): tests/server/policy/test_staged.py.


# --- the CLI -----------------------------------------------------------------------------------


async def test_cli_creates_a_plan_session_approves_its_plan_and_answers_a_batch(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher import cli
    from dispatcher.cli.output import EXIT_BY_CODE

    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_BETA)

    async def run(*argv: str) -> int:
        return await asyncio.to_thread(cli.main, [*argv[:1], "--server", harness.target, *argv[1:]])

    assert (
        await run(
            "create", "cli-ws", "--mode", "plan", "--tools", "write_file,list_dir", "--fs", "src:rw", "--json"
        )
        == 0
    )
    created = json.loads(capsys.readouterr().out)
    assert created["approval_mode"] == "plan" and created["tools"] == ["list_dir", "write_file"]
    assert created["fs"] == [{"path": "src", "mode": "rw"}]
    sid = created["session_id"]
    client = harness.client(TOKEN_BETA)
    await _items(client, sid, "write_file", {"path": "src/a", "content": "1"})
    assert await run("plan", sid, "approve", "--json") == 0
    decided = json.loads(capsys.readouterr().out)
    assert decided["approval_mode"] == "autonomous" and decided["steps"][0]["tool_name"] == "write_file"
    assert await run("sessions") == 0 and "mode=autonomous" in capsys.readouterr().out

    assert await run("create", "--mode", "review") == 0
    review_id = capsys.readouterr().out.split()[0]
    # Review stages writes without asking; shell asks as in cautious mode, answered as a batch.
    call = asyncio.create_task(_items(client, review_id, "shell", {"command": "true"}))
    await next_event(client, review_id, ToolConfirmationRequested)
    assert await run("approve", review_id, "all") == 0
    assert not _result(await asyncio.wait_for(call, 20)).is_error
    assert (
        await run("create", "--mode", "plan", "--tools", "no_such_tool") == EXIT_BY_CODE["INVALID_ARGUMENT"]
    )
