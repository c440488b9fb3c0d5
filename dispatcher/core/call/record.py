"""How one call goes on record: its audit records (spec 003) and what the observer is told.

A call the policy lets through gets ``tool.call.dispatched`` before its tool starts and
``tool.call.completed`` when it ends; one refused before it runs gets ``tool.call.denied``. Exactly
one final record per call, written even when the task running it is cancelled under it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatcher.core.audit import COMPLETED, DENIED
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.events.payloads import ToolFailed
from dispatcher.core.observe import UNKNOWN_TOOL, FinishedCall

if TYPE_CHECKING:
    from dispatcher.core.call.run_state import RunState

__all__ = ["abandoned", "record"]


def record(run: RunState, kind: str, outcome: str | None) -> None:
    """One audit record of ``run``; with an ``outcome``, its final one (written at most once)."""
    if outcome is not None:
        if run.ended:
            return
        run.ended = True
        _observe_end(run, outcome)
    audit = run.deps.audit
    if audit is None:
        return
    fields: dict[str, Any] = {"decision": run.decision}
    if outcome is not None:
        fields.update(outcome=outcome, duration_ms=round(run.elapsed_ms(), 3))
    audit.record(
        kind,
        tenant=run.session.tenant_id,
        session=run.session.session_id,
        turn=run.turn_id,
        tool_use_id=run.tool_use.id,
        tool=run.tool_name,
        input=run.summary(),
        **fields,
    )


def abandoned(run: RunState) -> None:
    """The task running ``run`` was cancelled (server shutdown, client gone): a ``tool.failed``
    event and the final record all the same."""
    if run.ended:
        return
    run.emit(
        ToolFailed(
            tool_name=run.tool_name,
            error_class=ToolErrorClass.CANCELLED.value,
            message="The dispatch was cancelled (server shutdown or the client went away)",
            duration_ms=round(run.run_ms(), 3),
        )
    )
    record(run, DENIED if run.run_started is None else COMPLETED, ToolErrorClass.CANCELLED.value)


def _observe_end(run: RunState, outcome: str) -> None:
    registered = run.deps.registry.get(run.tool_name)
    run.deps.observer.call_finished(
        FinishedCall(
            tenant=run.session.tenant_id,
            session_id=run.session.session_id,
            tool_use_id=run.tool_use.id,
            tool=run.tool_name if registered is not None else UNKNOWN_TOOL,  # never the caller's string
            outcome=outcome,
            started=run.started_wall,
            seconds=run.elapsed_ms() / 1000,
            ran=run.run_started is not None,
        )
    )
