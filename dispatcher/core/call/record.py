"""How one call goes on record: its audit records (spec 003) and what the observer is told.

A call the policy lets through gets ``tool.call.dispatched`` before its tool starts and
``tool.call.completed`` when it ends; one refused before it runs, or refused by the sandbox while it
ran, gets ``tool.call.denied``. Exactly one final record per call, written even when the task running
it is cancelled under it, with the call's ``reason`` slug; a refusal's ``decision`` is what refused
it (``refused``), never the ``auto`` a call starts with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatcher.core.audit import COMPLETED, DENIED, AuditDecision
from dispatcher.core.errors import FailureReason, ToolErrorClass
from dispatcher.core.events.payloads import ToolFailed
from dispatcher.core.observe import UNKNOWN_TOOL, FinishedCall

if TYPE_CHECKING:
    from dispatcher.core.call.run_state import RunState

__all__ = ["abandoned", "record", "refused"]

_DECISIONS = frozenset(AuditDecision)
_LET_THROUGH = frozenset(
    {
        AuditDecision.AUTO,
        AuditDecision.AUDIT,
        AuditDecision.ALLOW,
        AuditDecision.REMEMBERED_ALLOW,
        AuditDecision.STAGED,
    }
)
"""Decisions that let a call through: a refusal after them was decided by something else."""


def refused(run: RunState, reason: FailureReason) -> None:
    """``run`` is refused for ``reason``: unless a step already decided the refusal (a policy, a
    human, a plan), the reason is the decision (``tool_not_found``, ``invalid_args``,
    ``workspace_escape``, ...), so no refused call is on record as let through."""
    if run.decision in _LET_THROUGH and reason.value in _DECISIONS:
        run.decision = AuditDecision(reason.value)


def record(run: RunState, kind: str, outcome: str | None, reason: FailureReason | None = None) -> None:
    """One audit record of ``run``; with an ``outcome``, its final one (written at most once),
    carrying ``reason`` (none: the call succeeded)."""
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
        fields.update(outcome=outcome, reason=reason or "", duration_ms=round(run.elapsed_ms(), 3))
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
    if run.run_started is None:
        refused(run, FailureReason.CANCELLED)
    kind = DENIED if run.run_started is None else COMPLETED
    record(run, kind, ToolErrorClass.CANCELLED.value, FailureReason.CANCELLED)


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
