"""Approval modes, remembered answers and review diffs in the core, over the fake sandbox (staging
itself: ``test_staging.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from dispatcher.config.load import parse_policy
from dispatcher.core import ConfirmationPolicy, Decision, Session, TextBlock, ToolDispatcher, ToolUseBlock
from dispatcher.core.call.approve import ApprovalMode, approve_plan, parse_mode
from dispatcher.core.call.review import unified_diff as _diff
from dispatcher.core.events import payloads as ep
from dispatcher.core.types import SideEffect
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.blocks import text_at
from tests.events import ToolConfirmationRequested, ToolConfirmationResolved
from tests.unit.core.toolkit import definition, next_event


class Risky:
    definition = definition("risky", SideEffect.WRITE, always_prompt=True)

    async def execute(self, input: dict[str, Any], context: Any) -> Any:
        from dispatcher.core import ToolOutput

        return ToolOutput([TextBlock("done")])

    async def cancel(self) -> bool:
        return False


async def _run(d: ToolDispatcher, session: Session, name: str, tid: str) -> Any:
    return await d.dispatch(ToolUseBlock(tid, name, {}), session, turn_id="t")


async def test_always_prompt_answers_are_never_remembered(
    provider: FakeSandboxProvider, session: Session
) -> None:
    d = ToolDispatcher(provider, policy=ConfirmationPolicy())
    d.register(Risky)
    bus = d.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(_run(d, session, "risky", "a"))
        rid = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
        assert d.broker("s1").rememberable(rid) is False  # what ResolveConfirmation reports (issue 22)
        d.resolve_confirmation("s1", rid, Decision.DENY, remember=True)
        assert (await task).is_error
    assert d.broker("s1").remembered("risky") is None  # a remembered deny would outlive the question
    await d.aclose()


async def test_a_remembered_answer_is_published_each_time_it_applies(
    provider: FakeSandboxProvider, session: Session
) -> None:
    d = ToolDispatcher(provider, policy=parse_policy({"per_tool": {"echo": "prompt_once"}}))
    from tests.unit.core.toolkit import EchoTool

    d.register(EchoTool)
    bus = d.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(_run(d, session, "echo", "a"))
        rid = (await next_event(sub, ToolConfirmationRequested)).payload.request_id
        d.resolve_confirmation("s1", rid, Decision.ALLOW)
        assert not (await task).is_error
        for tid in ("b", "c"):
            assert not (await _run(d, session, "echo", tid)).is_error
            resolved = await next_event(sub, ToolConfirmationResolved)
            while resolved.tool_use_id != tid:
                resolved = await next_event(sub, ToolConfirmationResolved)
            assert resolved.payload == ep.ToolConfirmationResolved(
                request_id="", decision="allow", reason="remembered"
            )
    await d.aclose()


async def test_plan_mode_state_and_its_approval(provider: FakeSandboxProvider, session: Session) -> None:
    from tests.unit.core.toolkit import ShellLikeTool

    d = ToolDispatcher(provider, policy=ConfirmationPolicy())
    d.register(ShellLikeTool)
    planned = replace(session, approval_mode=ApprovalMode.PLAN)
    d.open_session(planned)
    result = await d.dispatch(ToolUseBlock("r1", "run", {"command": "make"}), planned, turn_id="t")
    assert result.is_error and "plan mode" in text_at(result)
    state = d.session_state("s1")
    assert [s.tool_use_id for s in state.plan] == ["r1"]
    steps, mode = approve_plan(state, allow=True)
    assert len(steps) == 1 and mode is ApprovalMode.AUTONOMOUS and state.plan == []
    ran = await d.dispatch(ToolUseBlock("r2", "run", {"command": "make"}), planned, turn_id="t")
    assert not ran.is_error  # autonomous now: no question
    with pytest.raises(ValueError, match="not in plan mode"):
        approve_plan(state, allow=True)
    await d.aclose()


def test_parse_mode() -> None:
    assert parse_mode("") is ApprovalMode.CAUTIOUS and parse_mode("Review") is ApprovalMode.REVIEW
    with pytest.raises(ValueError, match="unknown approval mode"):
        parse_mode("yolo")


def test_review_diffs() -> None:
    assert _diff("f", None, b"new\n").startswith("--- /dev/null\n+++ b/f\n")
    assert "Binary file f: 2 bytes -> 1 bytes" in _diff("f", b"\x00\x01", b"\xff")
    assert "\\ No newline at end of file" in _diff("f", b"a", b"b")
    assert _diff("f", b"same\n", b"same\n") == "No change to f\n"


async def test_a_plan_is_bounded(
    provider: FakeSandboxProvider, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher.core.call import approve as approval
    from tests.unit.core.toolkit import ShellLikeTool

    monkeypatch.setattr(approval, "MAX_PLAN_STEPS", 2)
    d = ToolDispatcher(provider, policy=ConfirmationPolicy())
    d.register(ShellLikeTool)
    planned = replace(session, approval_mode=ApprovalMode.PLAN)
    d.open_session(planned)
    for i in range(3):
        result = await d.dispatch(
            ToolUseBlock(f"r{i}", "run", {"command": "x" * 10_000}), planned, turn_id="t"
        )
        assert result.is_error
    assert "already has 2 steps" in text_at(result)
    steps = d.session_state("s1").plan
    assert len(steps) == 2 and all(len(s.input_summary) <= approval.PLAN_SUMMARY_CHARS for s in steps)
    await d.aclose()
