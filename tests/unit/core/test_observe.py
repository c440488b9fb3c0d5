"""Audit before the call runs, cancelled dispatches on record, and what the observer is told."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.core import MemoryAuditLog, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.events import bus as ev
from dispatcher.core.observe import UNKNOWN_TOOL, FinishedCall, log_context
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.unit.core.toolkit import ALL_TOOLS, SlowTool, definition, next_event


class Recorder:
    def __init__(self) -> None:
        self.calls: list[FinishedCall] = []
        self.waits: list[float] = []

    def call_finished(self, call: FinishedCall) -> None:
        self.calls.append(call)

    def confirmation_waited(self, seconds: float) -> None:
        self.waits.append(seconds)


def kinds(audit: MemoryAuditLog) -> list[str]:
    return [r["kind"] for r in audit.records]


async def test_dispatched_is_recorded_before_the_tool_runs_and_completed_after(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    SlowTool.started = started = asyncio.Event()
    try:
        tool_use = ToolUseBlock("tu_1", "slow", {"seconds": 30})
        task = asyncio.create_task(dispatcher.dispatch(tool_use, session))
        await started.wait()
        (dispatched,) = audit.records  # the tool is running: only the dispatched record exists
        assert dispatched["kind"] == "tool.call.dispatched"
        assert dispatched["input"] == {"seconds": 30} and "outcome" not in dispatched
        assert (dispatched["tool"], dispatched["tool_use_id"], dispatched["tenant"]) == ("slow", "tu_1", "t1")
        await dispatcher.cancel_tool_uses("s1", ["tu_1"])
        result = await task
    finally:
        SlowTool.started = None
    assert result.is_error
    assert kinds(audit) == ["tool.call.dispatched", "tool.call.completed"]
    assert audit.records[-1]["outcome"] == "cancelled" and audit.records[-1]["input"] == {"seconds": 30}


async def test_a_cancelled_dispatch_task_leaves_a_record_and_a_failed_event(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    SlowTool.started = started = asyncio.Event()
    bus = dispatcher.open_session(session)
    try:
        async with bus.subscribe() as sub:
            task = asyncio.create_task(
                dispatcher.dispatch(ToolUseBlock("tu_2", "slow", {"seconds": 30}), session)
            )
            await started.wait()
            task.cancel()  # what server shutdown and a vanished client do to the Dispatch task
            failed = await next_event(sub, ev.TOOL_FAILED)
        assert task.cancelled() or (await asyncio.gather(task, return_exceptions=True))
    finally:
        SlowTool.started = None
    assert failed.tool_use_id == "tu_2" and failed.payload.error_class == "cancelled"
    assert kinds(audit) == ["tool.call.dispatched", "tool.call.completed"]
    assert audit.records[-1]["outcome"] == "cancelled"


async def test_a_dispatch_cancelled_while_waiting_for_confirmation_is_denied_on_record(
    dispatcher: ToolDispatcher, session: Session, audit: MemoryAuditLog
) -> None:
    bus = dispatcher.open_session(session)
    async with bus.subscribe() as sub:
        task = asyncio.create_task(
            dispatcher.dispatch(ToolUseBlock("tu_3", "write", {"path": "a", "content": "b"}), session)
        )
        await next_event(sub, ev.TOOL_CONFIRMATION_REQUESTED)
        task.cancel()
        failed = await next_event(sub, ev.TOOL_FAILED)
    await asyncio.gather(task, return_exceptions=True)
    assert failed.payload.error_class == "cancelled"
    assert kinds(audit) == ["tool.call.denied"] and audit.records[0]["outcome"] == "cancelled"


async def test_the_observer_hears_every_call_with_bounded_labels(
    provider: FakeSandboxProvider, session: Session
) -> None:
    recorder = Recorder()
    d = ToolDispatcher(provider, observer=recorder)
    for factory in ALL_TOOLS:
        d.register(factory)
    try:
        await d.dispatch(ToolUseBlock("a", "echo", {"text": "hi"}), session)
        await d.dispatch(ToolUseBlock("b", "no such tool \x00 {evil}", {}), session)
        await d.dispatch(ToolUseBlock("c", "slow", {"seconds": "soon"}), session)
    finally:
        await d.aclose()
    seen = [(c.tool, c.outcome, c.ran) for c in recorder.calls]
    assert seen == [
        ("echo", "ok", True),
        (UNKNOWN_TOOL, "not_found", False),
        ("slow", "validation_error", False),
    ]
    assert all(c.tenant == "t1" and c.session_id == "s1" and c.seconds >= 0 for c in recorder.calls)


async def test_log_lines_written_during_a_call_carry_its_ids(
    provider: FakeSandboxProvider, session: Session
) -> None:
    seen: list[dict[str, str]] = []

    class Peek:
        definition = definition("peek", input_schema={"type": "object"})

        async def execute(self, input: dict[str, Any], context: Any) -> Any:
            from dispatcher.core import TextBlock, ToolOutput

            seen.append(dict(log_context.get()))
            return ToolOutput([TextBlock("ok")])

        async def cancel(self) -> bool:
            return False

    d = ToolDispatcher(provider)
    d.register(Peek)
    try:
        await d.dispatch(ToolUseBlock("tu_9", "peek", {}), session)
    finally:
        await d.aclose()
    assert seen == [{"tenant": "t1", "session": "s1", "tool_use_id": "tu_9", "tool": "peek"}]
    assert dict(log_context.get()) == {}


async def test_the_observer_hears_how_long_a_confirmation_waited(
    provider: FakeSandboxProvider, session: Session
) -> None:
    from dispatcher.core import Decision

    recorder = Recorder()
    d = ToolDispatcher(provider, observer=recorder)
    for factory in ALL_TOOLS:
        d.register(factory)
    bus = d.open_session(session)
    try:
        async with bus.subscribe() as sub:
            task = asyncio.create_task(
                d.dispatch(ToolUseBlock("w", "write", {"path": "a", "content": "b"}), session)
            )
            asked = await next_event(sub, ev.TOOL_CONFIRMATION_REQUESTED)
            d.resolve_confirmation("s1", asked.payload.request_id, Decision.ALLOW)
            assert not (await task).is_error
    finally:
        await d.aclose()
    assert len(recorder.waits) == 1 and recorder.waits[0] >= 0
    assert [(c.tool, c.outcome) for c in recorder.calls] == [("write", "ok")]
