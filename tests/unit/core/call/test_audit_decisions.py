"""The audit log records the decision that really applied to each call, with its reason slug
(spec 003 §5): refusals before the policy step are not ``auto``, and a refusal inside the sandbox of
a call that ran unasked is a denial, not a completion."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher.config.load import parse_policy
from dispatcher.core import (
    Capabilities,
    Decision,
    DispatcherConfig,
    FsGrant,
    MemoryAuditLog,
    Session,
    ToolDispatcher,
    ToolErrorClass,
    ToolUseBlock,
)
from dispatcher.core.audit import AuditDecision
from dispatcher.core.errors import FailureReason
from dispatcher.core.types import UnparsedInput
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.events import ToolConfirmationRequested
from tests.unit.core.toolkit import ALL_TOOLS, WriteTool, next_event


async def run(d: ToolDispatcher, session: Session, name: str, input_: Any, tid: str = "tu_1") -> Any:
    return await d.dispatch(ToolUseBlock(tid, name, input_), session, turn_id="turn_1")


def trail(audit: MemoryAuditLog, tid: str = "tu_1") -> list[tuple[str, str, str | None]]:
    """(kind, decision, reason) of each record of one call; ``None``: the record has no reason."""
    return [(r["kind"], r["decision"], r.get("reason")) for r in audit.records if r["tool_use_id"] == tid]


async def test_an_unknown_tool_is_denied_as_tool_not_found(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    result = await run(dispatcher, session, "no_such_tool", {})
    assert result.error_class is ToolErrorClass.NOT_FOUND
    assert trail(audit) == [("tool.call.denied", "tool_not_found", "tool_not_found")]
    assert audit.records[-1]["outcome"] == "not_found"


async def test_invalid_input_is_denied_as_invalid_args(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    await run(dispatcher, session, "read", {"path": 7}, "tu_schema")
    await run(dispatcher, session, "read", UnparsedInput("{not json", "not JSON"), "tu_json")
    assert trail(audit, "tu_schema") == [("tool.call.denied", "invalid_args", "invalid_args")]
    assert trail(audit, "tu_json") == [("tool.call.denied", "invalid_args", "invalid_args")]


async def test_an_input_over_the_size_bound_is_denied_as_input_too_large(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    too_large = UnparsedInput("", "input_json is 9,000,000 bytes", reason=FailureReason.INPUT_TOO_LARGE)
    await run(dispatcher, session, "read", too_large)
    assert trail(audit) == [("tool.call.denied", "input_too_large", "input_too_large")]


async def test_a_lexical_workspace_escape_is_denied_as_workspace_escape(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    result = await run(dispatcher, session, "read", {"path": "../../etc/passwd"})
    assert result.error_class is ToolErrorClass.PERMISSION_DENIED
    assert trail(audit) == [("tool.call.denied", "workspace_escape", "workspace_escape")]


async def test_a_symlink_escape_checked_before_asking_is_denied_as_workspace_escape(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider, audit: MemoryAuditLog
) -> None:
    provider.sandbox_for(session).links["out"] = "../../etc"
    await run(dispatcher, session, "write", {"path": "out/passwd", "content": "x"})  # asked: resolved first
    assert trail(audit) == [("tool.call.denied", "workspace_escape", "workspace_escape")]


async def test_a_symlink_escape_refused_inside_the_sandbox_is_recorded_as_a_denial(
    dispatcher: ToolDispatcher, session: Session, provider: FakeSandboxProvider, audit: MemoryAuditLog
) -> None:
    # A read runs unasked and nothing narrows the workspace: the path is not resolved before the
    # call, so only the sandbox refuses it, after the call was dispatched.
    provider.sandbox_for(session).links["out"] = "../../etc"
    result = await run(dispatcher, session, "read", {"path": "out/passwd"})
    assert result.error_class is ToolErrorClass.PERMISSION_DENIED
    assert trail(audit) == [
        ("tool.call.dispatched", "auto", None),
        ("tool.call.denied", "workspace_escape", "workspace_escape"),
    ]


async def test_grant_capability_and_policy_refusals_carry_their_reason(
    provider: FakeSandboxProvider, tmp_path: Any, audit: MemoryAuditLog
) -> None:
    d = ToolDispatcher(provider, policy=parse_policy({"default": {"EXECUTE": "deny"}}), audit=audit)
    for factory in ALL_TOOLS:
        d.register(factory)
    caps = Capabilities(allowed_tools=frozenset({"read", "run"}), fs_grants=(FsGrant("docs", "r"),))
    session = Session("s2", str(tmp_path), tenant_id="t1", capabilities=caps)
    await run(d, session, "read", {"path": "secrets/key"}, "tu_grant")
    await run(d, session, "echo", {"text": "x"}, "tu_cap")
    await run(d, session, "run", {"command": "true"}, "tu_policy")
    assert trail(audit, "tu_grant") == [("tool.call.denied", "fs_denied", "fs_denied")]
    assert trail(audit, "tu_cap") == [("tool.call.denied", "capability_denied", "capability_denied")]
    assert trail(audit, "tu_policy") == [("tool.call.denied", "policy_denied", "policy_denied")]
    await d.aclose()


@pytest.mark.parametrize(
    ("name", "input_", "outcome", "reason"),
    [
        ("echo", {"text": "hi"}, "ok", ""),
        ("raiser", {"text": "x"}, "execution_error", "tool_failed"),
    ],
)
async def test_a_dispatched_call_ends_with_its_outcome_and_reason(
    dispatcher: ToolDispatcher,
    session: Session,
    audit: MemoryAuditLog,
    name: str,
    input_: Any,
    outcome: str,
    reason: str,
) -> None:
    await run(dispatcher, session, name, input_)
    assert trail(audit) == [("tool.call.dispatched", "auto", None), ("tool.call.completed", "auto", reason)]
    assert audit.records[-1]["outcome"] == outcome


def test_every_failure_reason_of_a_refusal_is_a_decision() -> None:
    # A refusal's decision is its reason when no step decided otherwise: each must be a member.
    refusals = {
        FailureReason.TOOL_NOT_FOUND,
        FailureReason.INVALID_ARGS,
        FailureReason.INPUT_TOO_LARGE,
        FailureReason.WORKSPACE_ESCAPE,
        FailureReason.FS_DENIED,
        FailureReason.CAPABILITY_DENIED,
        FailureReason.CANCELLED,
        FailureReason.SANDBOX_FAILED,
    }
    assert {r.value for r in refusals} <= {d.value for d in AuditDecision}


async def test_a_humans_answers_and_silence_are_on_record_with_their_reason(
    provider: FakeSandboxProvider, tmp_path: Any, audit: MemoryAuditLog
) -> None:
    d = ToolDispatcher(provider, config=DispatcherConfig(confirmation_timeout=0.05), audit=audit)
    d.register(WriteTool)
    asked = Session("s_asked", str(tmp_path), tenant_id="t1")
    silent = Session("s_silent", str(tmp_path), tenant_id="t1")
    bus = d.open_session(asked)
    d.open_session(silent)
    write = {"path": "a.txt", "content": "x"}
    async with bus.subscribe() as sub:
        denied = asyncio.create_task(run(d, asked, "write", write, "tu_deny"))
        rid = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
        d.resolve_confirmation(asked.session_id, rid, Decision.DENY, remember=True)
        await denied
    await run(d, asked, "write", write, "tu_remembered")  # the remembered deny answers at once
    await run(d, silent, "write", write, "tu_silence")  # nobody answers in time
    assert trail(audit, "tu_deny") == [("tool.call.denied", "deny", "user_denied")]
    assert trail(audit, "tu_remembered") == [("tool.call.denied", "remembered_deny", "remembered_deny")]
    assert trail(audit, "tu_silence") == [
        ("tool.call.denied", "confirmation_timeout", "confirmation_timeout")
    ]
    await d.aclose()
