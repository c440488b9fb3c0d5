"""Step 4 of a call (spec 000 §4): the session's approval mode (spec 004), the confirmation policy,
remembered answers, and asking a human.

Modes (``Session.approval_mode``; the README's Policy section has the table):

- ``cautious``: the tenant's ``tool_confirmation`` policy as configured (default: WRITE, EXECUTE
  and NETWORK prompt).
- ``autonomous``: nothing asks; ``manual``: everything asks, NONE and READ included.
- ``plan``: NONE/READ calls run as in cautious; a call with side effects does not run: it becomes a
  proposed step of the session's plan (``tool.step_proposed``) and its result says so. Once a human
  approves the plan (``ApprovePlan``) the session behaves as ``autonomous``.
- ``review``: writes of tools that can preview them (``Previewable``: ``write_file``, ``patch_file``)
  are staged without asking: kept off the disk, the call returns at once (``core/call/review.py``), and
  a human applies or discards each staged file later (``core/staging/apply.py``). Other calls as
  cautious.
- ``audit``: nothing asks and every call is recorded (audit log decision ``audit``); writes of
  previewing tools are staged as in review, and a human applies them all or none.

In every mode a ``deny`` of the tenant's policy (per tool or per class) stays a deny, a per-tool
mode of the policy wins over the mode's class defaults (in ``manual`` it can only ask or deny), the
operator's per-mode overrides (``tool_confirmation.modes.<mode>.per_tool``) win over ``per_tool``
but never open a denied class, and ``always_prompt`` tools (the definition's or the operator's
``tool_confirmation.always_prompt``) always ask and are never remembered.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from dispatcher.core.approval.broker import Decision
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy, Mode
from dispatcher.core.approval.modes import ApprovalMode as ApprovalMode
from dispatcher.core.approval.modes import parse_mode as parse_mode
from dispatcher.core.audit import AuditDecision
from dispatcher.core.errors import (
    ConfirmationTimeout,
    FailureReason,
    ToolCancelled,
    ToolPermissionDenied,
    ToolUserDenied,
)
from dispatcher.core.events.payloads import (
    ToolConfirmationRequested,
    ToolConfirmationResolved,
    ToolStepProposed,
)
from dispatcher.core.sessions.state import PlanStep as PlanStep
from dispatcher.core.text.display import confirmation_text
from dispatcher.core.text.truncate import truncate_head_tail
from dispatcher.core.text.visible import visible
from dispatcher.core.types import SideEffect, ToolDefinition

if TYPE_CHECKING:
    from dispatcher.core.call.run_state import RunState
    from dispatcher.core.sessions.state import SessionState

__all__ = [
    "ApprovalMode",
    "PlanStep",
    "approve_plan",
    "confirm",
    "mode_policy",
    "parse_mode",
    "policy_mode",
    "projected",
    "stages",
]

SIDE_EFFECTS_THAT_CHANGE = frozenset({SideEffect.WRITE, SideEffect.EXECUTE, SideEffect.NETWORK})
MAX_PLAN_STEPS = 200
"""Steps one plan holds; a call beyond is refused unrecorded (the session's memory stays bounded)."""
PLAN_SUMMARY_CHARS = 2_000
"""A step keeps its input this long (head and tail): approving a plan switches the mode, it does not
approve these exact calls, which the model makes again."""
_ANSWERED = {Decision.ALLOW: AuditDecision.ALLOW, Decision.DENY: AuditDecision.DENY}
_REMEMBERED = {Decision.ALLOW: AuditDecision.REMEMBERED_ALLOW, Decision.DENY: AuditDecision.REMEMBERED_DENY}
STAGING_MODES = frozenset({"review", "audit"})
"""The approval modes whose previewing writes are staged (``core/staging/area.py``)."""


_MODE_POLICIES: dict[tuple[int, str], tuple[ConfirmationPolicy, ConfirmationPolicy]] = {}
_MODE_POLICIES_KEPT = 256


def mode_policy(base: ConfirmationPolicy, mode: str) -> ConfirmationPolicy:
    """``base`` (the tenant's policy) as ``mode`` applies it: the mode sets the class defaults,
    except where ``base`` denies; trusted workspaces only lower the bar of ``cautious``; in
    ``manual`` a ``per_tool`` auto or prompt_once asks too (every step is approved); the operator's
    ``tool_confirmation.modes.<mode>.per_tool`` entries then win over ``per_tool``.

    Made once per policy object and mode (every call asks; policies are frozen and long-lived)."""
    key = (id(base), str(mode))
    kept = _MODE_POLICIES.get(key)
    if kept is not None and kept[0] is base:  # the same object, not a new one at a reused id
        return kept[1]
    applied = _mode_policy(base, mode)
    if len(_MODE_POLICIES) >= _MODE_POLICIES_KEPT:
        _MODE_POLICIES.clear()
    _MODE_POLICIES[key] = (base, applied)
    return applied


def _mode_policy(base: ConfirmationPolicy, mode: str) -> ConfirmationPolicy:
    base = replace(base, in_mode=dict(base.modes.get(str(mode), {})))
    if mode in (ApprovalMode.AUTONOMOUS, ApprovalMode.AUDIT):
        floor = Mode.AUTO
    elif mode == ApprovalMode.MANUAL:
        floor = Mode.PROMPT
    else:
        return base
    default = {e: Mode.DENY if base.default.get(e) is Mode.DENY else floor for e in SideEffect}
    per_tool = base.per_tool
    if mode == ApprovalMode.MANUAL:
        per_tool = {t: Mode.DENY if m is Mode.DENY else Mode.PROMPT for t, m in per_tool.items()}
    return replace(
        base, default=default, per_tool=per_tool, trusted_workspaces=(), trusted_workspace_overrides={}
    )


def always_asks(run: RunState, definition: ToolDefinition) -> bool:
    """Whether every call of this tool asks, never remembered: its definition says so, or the
    operator's ``tool_confirmation.always_prompt`` lists it."""
    return definition.always_prompt or (run.session.policy or run.deps.policy).asks_always(definition.name)


def policy_mode(run: RunState, definition: ToolDefinition) -> Mode:
    """The confirmation mode of this call under the session's current approval mode.

    Raises:
        ToolPermissionDenied: the policy denies the tool.
    """
    policy = mode_policy(run.session.policy or run.deps.policy, run.state.mode)
    mode = policy.mode_for(
        definition.name,
        definition.side_effect,
        run.session.workspace_path,
        always_prompt=definition.always_prompt,
    )
    if mode is Mode.DENY:
        run.decision = AuditDecision.POLICY_DENIED
        raise ToolPermissionDenied(
            f"Tool {definition.name!r} is denied by the confirmation policy",
            reason=FailureReason.POLICY_DENIED,
        )
    if stages(run, definition):
        # Staged, not run: the human's approval is the apply. Only a tool that always asks does.
        run.decision = AuditDecision.STAGED
        return Mode.PROMPT if always_asks(run, definition) else Mode.AUTO
    if run.state.mode == ApprovalMode.PLAN and definition.side_effect in SIDE_EFFECTS_THAT_CHANGE:
        return Mode.PROMPT  # held back as a step; resolved first, so the step shows its real paths
    if run.state.mode == ApprovalMode.AUDIT and mode is Mode.AUTO:
        run.decision = AuditDecision.AUDIT  # its audit record says it ran unasked, for review
    return mode


async def confirm(run: RunState, definition: ToolDefinition, input_: dict[str, Any], mode: Mode) -> None:
    """Step 4: propose (plan), or ask unless the policy says auto or an answer is remembered.

    Raises:
        ToolUserDenied: denied now, by a remembered answer, or held back by plan mode.
        ConfirmationTimeout, ToolCancelled, ToolPermissionDenied: see ``ask``.
    """
    if run.state.mode == ApprovalMode.PLAN and definition.side_effect in SIDE_EFFECTS_THAT_CHANGE:
        propose(run, definition, input_)
    if mode is Mode.AUTO:
        return
    broker = run.state.broker
    always = always_asks(run, definition)
    remembered = None if always else broker.remembered(definition.name)
    if remembered is not None:
        run.decision = _REMEMBERED[remembered]
        # Watchers see why the call ran (or was refused) without a question.
        run.emit(ToolConfirmationResolved(request_id="", decision=remembered.value, reason="remembered"))
        if remembered is Decision.DENY:
            raise ToolUserDenied(
                f"User denied {definition.name!r} earlier and asked to remember it: refused for the rest "
                "of this session without asking.",
                reason=FailureReason.REMEMBERED_DENY,
            )
        return
    decision, remember = await ask(run, definition, input_)
    if (remember or mode is Mode.PROMPT_ONCE) and not always:
        broker.remember(definition.name, decision)  # an always-prompt tool is never remembered
    run.decision = _ANSWERED[decision]
    if decision is Decision.DENY:
        raise ToolUserDenied("User denied this operation.")


def stages(run: RunState, definition: ToolDefinition) -> bool:
    """Whether this call is staged instead of run: the session reviews or audits, and the tool
    previews its write."""
    if run.state.mode not in STAGING_MODES:
        return False
    registered = run.deps.registry.get(definition.name)
    return registered is not None and registered.previews


def propose(run: RunState, definition: ToolDefinition, input_: dict[str, Any]) -> None:
    """Record the call as the next step of the session's plan, publish it, and refuse to run it."""
    if len(run.state.plan) >= MAX_PLAN_STEPS:
        run.decision = AuditDecision.PLAN_FULL
        raise ToolUserDenied(
            f"The session is in plan mode and its plan already has {MAX_PLAN_STEPS} steps: "
            f"{definition.name!r} was not run nor recorded. Stop and wait for the plan's approval.",
            reason=FailureReason.PLAN_FULL,
        )
    shown = confirmation_text(definition.name, input_, run.config.confirmation_max_chars)
    step = PlanStep(
        step=len(run.state.plan) + 1,
        turn_id=run.turn_id,
        tool_use_id=run.tool_use.id,
        tool_name=definition.name,
        side_effect=definition.side_effect.value,
        input_summary=truncate_head_tail(shown.text, PLAN_SUMMARY_CHARS),
        projected_modifications=tuple(projected(definition, run.resolved)),
    )
    run.state.plan.append(step)
    run.decision = AuditDecision.PLAN_PROPOSED
    run.emit(
        ToolStepProposed(
            step=step.step,
            tool_name=step.tool_name,
            input_summary=step.input_summary,
            side_effect=step.side_effect,
            projected_modifications=step.projected_modifications,
        )
    )
    raise ToolUserDenied(
        f"The session is in plan mode: {definition.name!r} was not run. It is recorded as step "
        f"{step.step} of the proposed plan; calls with side effects run once a human approves the "
        "plan. Reads still run: go on planning, then stop and wait for the approval.",
        reason=FailureReason.PLAN_PROPOSED,
    )


async def ask(
    run: RunState, definition: ToolDefinition, input_: dict[str, Any], *, diff: str | None = None
) -> tuple[Decision, bool]:
    """Publish a confirmation request and wait for its answer (``diff``: a staged write's).

    Raises:
        ToolPermissionDenied: the input is too long to show whole.
        ToolCancelled: the call was cancelled while waiting.
        ConfirmationTimeout: nobody answered in time.
    """
    config = run.config
    shown = confirmation_text(definition.name, input_, config.confirmation_max_chars)
    if shown.too_long:
        # Approving part of an input would be approving the rest unseen: refuse instead.
        run.decision = AuditDecision.TOO_LONG_TO_CONFIRM
        raise ToolPermissionDenied(
            f"The input of {definition.name!r} is {shown.chars:,} characters; a confirmation request "
            f"shows at most {config.confirmation_max_chars:,}, so the call is refused unseen",
            reason=FailureReason.TOO_LONG_TO_CONFIRM,
        )
    broker = run.state.broker
    request_id, answer = broker.open(rememberable=not always_asks(run, definition))
    run.emit(
        ToolConfirmationRequested(
            request_id=request_id,
            tool_name=definition.name,
            input_summary=shown.text,
            side_effect=definition.side_effect.value,
            projected_modifications=tuple(projected(definition, run.resolved)),
            diff=diff or "",
        )
    )
    asked = time.monotonic()
    answered = await run.call.wait(cast("asyncio.Future[Any]", answer), config.confirmation_timeout)
    run.deps.observer.confirmation_waited(time.monotonic() - asked)
    if answered and not answer.cancelled():
        decision, remember = answer.result()
        run.emit(ToolConfirmationResolved(request_id=request_id, decision=decision.value, reason="client"))
        return decision, remember
    broker.expire(request_id)
    if run.call.cancel_event.is_set():
        run.emit(ToolConfirmationResolved(request_id=request_id, decision="deny", reason="cancelled"))
        raise ToolCancelled("Tool call was cancelled while waiting for confirmation")
    run.emit(ToolConfirmationResolved(request_id=request_id, decision="deny", reason="timeout"))
    run.decision = AuditDecision.CONFIRMATION_TIMEOUT
    raise ConfirmationTimeout(
        f"No confirmation for {definition.name!r} within {config.confirmation_timeout:g} s"
    )


def projected(definition: ToolDefinition, resolved: dict[str, str]) -> list[str]:
    """What a confirmed call will change: the real paths it writes (relative to the workspace).

    Escaped as list_dir shows names (a byte that is not UTF-8 as ``\\udcNN``, a backslash doubled):
    one path is one line a human can read, and the model can give it back. ``files_modified`` in
    results uses the same form."""
    return [
        visible(resolved[key], escape_backslash=True)
        for key, mode in definition.requires_fs
        if mode == "rw" and key in resolved
    ]


def approve_plan(
    state: SessionState, allow: bool, approved: ApprovalMode = ApprovalMode.AUTONOMOUS
) -> tuple[list[PlanStep], ApprovalMode]:
    """Approve (the session runs in ``approved`` mode from now on: autonomous unless its tenant
    does not allow that) or reject (it stays in plan mode) the proposed steps; either way they are
    cleared and returned with the mode now in force.

    Raises:
        ValueError: the session is not in plan mode.
    """
    if state.mode != ApprovalMode.PLAN:
        raise ValueError(f"the session is not in plan mode (it is {state.mode})")
    steps = list(state.plan)
    state.plan.clear()
    if allow:
        state.mode = approved
    return steps, ApprovalMode(state.mode)
