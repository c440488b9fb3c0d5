"""The RPCs about a session's approvals beyond one answer: the plan of a plan-mode session,
answering a batch of confirmation requests at once, and the staged changes of a review or audit
session (``core/staging/area.py``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from dispatcher.core.approval.broker import Decision
from dispatcher.core.call.approve import ApprovalMode, PlanStep, approve_plan
from dispatcher.core.errors import UnknownConfirmationError
from dispatcher.core.staging.apply import ApplyOutcome
from dispatcher.core.staging.area import StagedChange
from dispatcher.server.requests.checks import MAX_ID_CHARS
from dispatcher.server.requests.errors import FailedPrecondition, InvalidRequest
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import Tenant, plan_approved_mode

log = logging.getLogger("dispatcher.server.sessions.manager")

MAX_BATCH = 4096


def decide_plan(
    sessions: SessionManager, tenant: Tenant, session_id: str, decision: Decision
) -> tuple[list[PlanStep], ApprovalMode]:
    """ApprovePlan: the proposed steps (cleared) and the mode now in force.

    Raises:
        UnknownSessionError: no such session for this tenant.
        FailedPrecondition: the session is not in plan mode.
    """
    state = sessions.get(tenant, session_id)
    approved = plan_approved_mode(tenant)
    if approved is None and decision is Decision.ALLOW:
        raise FailedPrecondition(
            f"tenant {tenant.tenant_id!r} allows neither autonomous nor cautious sessions, so a plan "
            "cannot be approved as a whole; answer each call instead"
        )
    try:
        steps, mode = approve_plan(state, decision is Decision.ALLOW, approved or ApprovalMode.AUTONOMOUS)
    except ValueError as exc:
        raise FailedPrecondition(str(exc)) from None
    sessions.persistence.save_policy(state)  # the mode in force survives a restart
    log.info(
        "plan %s",
        "approved" if decision is Decision.ALLOW else "rejected",
        extra={"tenant_id": tenant.tenant_id, "session_id": session_id, "steps": len(steps)},
    )
    return steps, mode


def resolve_many(
    sessions: SessionManager,
    tenant: Tenant,
    session_id: str,
    decision: Decision,
    request_ids: Sequence[str],
) -> list[str]:
    """ResolveConfirmations: answer the listed requests (none listed: every pending one); returns
    the ids this answer decided. Unknown or already answered ids are skipped."""
    sessions.get(tenant, session_id)
    if len(request_ids) > MAX_BATCH or any(len(r) > MAX_ID_CHARS for r in request_ids):
        raise InvalidRequest(f"request_ids: at most {MAX_BATCH} ids of at most {MAX_ID_CHARS} characters")
    broker = sessions.dispatcher.broker(session_id)
    applied = []
    for request_id in list(request_ids) or broker.pending_ids():
        try:
            done, _ = broker.resolve(request_id, decision)
        except UnknownConfirmationError:
            continue
        if done:
            applied.append(request_id)
    log.info(
        "confirmations answered as a batch",
        extra={"tenant_id": tenant.tenant_id, "session_id": session_id, "decision": str(decision)},
    )
    return applied


def _check_ids(ids: Sequence[str]) -> None:
    if len(ids) > MAX_BATCH or any(len(i) > MAX_ID_CHARS for i in ids):
        raise InvalidRequest(f"ids: at most {MAX_BATCH} ids of at most {MAX_ID_CHARS} characters")


def list_staged(sessions: SessionManager, tenant: Tenant, session_id: str) -> list[StagedChange]:
    """ListStagedChanges: the session's staged changes, oldest first.

    Raises:
        UnknownSessionError: no such session for this tenant.
    """
    sessions.get(tenant, session_id)
    return sessions.dispatcher.staged_changes(session_id)


async def apply_staged(
    sessions: SessionManager, tenant: Tenant, session_id: str, ids: Sequence[str]
) -> ApplyOutcome:
    """ApplyStagedChanges: write the listed changes (none listed: all); see ``core/staging/apply.py``.
    The writes go through the sandbox, so the session is held and resumed first if paused, as for
    a Dispatch or a transfer: a frozen agent would not answer, and the sandbox would be recreated.

    Raises:
        UnknownSessionError: no such session for this tenant.
        UnknownStagedChangeError: an id names no staged change (nothing is written).
    """
    state = sessions.get(tenant, session_id)
    _check_ids(ids)
    async with sessions.lifecycle.hold(state):
        outcome = await sessions.dispatcher.apply_staged(session_id, ids)
    log.info(
        "staged changes applied",
        extra={
            "tenant_id": tenant.tenant_id,
            "session_id": session_id,
            "applied": len(outcome.applied),
            "refused": len(outcome.refused),
        },
    )
    return outcome


async def discard_staged(
    sessions: SessionManager, tenant: Tenant, session_id: str, ids: Sequence[str]
) -> list[StagedChange]:
    """DiscardStagedChanges: drop the listed changes (none listed: all). Nothing reaches the
    sandbox, so a paused session stays paused.

    Raises:
        UnknownSessionError: no such session for this tenant.
        UnknownStagedChangeError: an id names no staged change (nothing is dropped).
    """
    sessions.get(tenant, session_id)
    _check_ids(ids)
    dropped = await sessions.dispatcher.discard_staged(session_id, ids)
    log.info(
        "staged changes discarded",
        extra={"tenant_id": tenant.tenant_id, "session_id": session_id, "discarded": len(dropped)},
    )
    return dropped
