"""A session's policy state as ``state.db`` keeps it: one JSON object per session.

``policy_to_json`` writes it: the remembered answers, the session's own approval mode and
capabilities, the mode in force when an approved plan changed it, and the plan's proposed steps.
The readers take what a restarted server gives back; the file may be stale or damaged, so
malformed answers and steps are dropped (never trusted) and malformed session fields refuse the
start (``ValueError``, a damaged row).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, get_args

from dispatcher.core.blocks import GrantMode
from dispatcher.core.call.approve import MAX_PLAN_STEPS, PLAN_SUMMARY_CHARS
from dispatcher.core.capabilities import Capabilities, FsGrant
from dispatcher.core.sessions.session import Session
from dispatcher.core.sessions.state import PlanStep

__all__ = [
    "mode_in_force_from_json",
    "plan_from_json",
    "policy_to_json",
    "remembered_from_json",
    "session_fields_from_json",
]

_MAX_ID = 256
_MAX_PATHS = 64


def policy_to_json(
    remembered: Mapping[str, str],
    session: Session | None = None,
    mode_in_force: str | None = None,
    plan: Iterable[PlanStep] = (),
) -> dict[str, Any]:
    """The per-session policy state as stored: ``remembered`` (tool -> "allow"/"deny"), the
    session's own policy fields (its approval mode, its capabilities), the mode in force when
    it differs (an approved plan made it ``autonomous``) and the plan's proposed steps."""
    policy: dict[str, Any] = {"remembered": dict(remembered)}
    steps = [
        {**dataclasses.asdict(step), "projected_modifications": list(step.projected_modifications)}
        for step in plan
    ]
    if steps:
        policy["plan"] = steps
    if session is not None:
        policy["approval_mode"] = session.approval_mode
        if mode_in_force and mode_in_force != session.approval_mode:
            policy["mode_in_force"] = str(mode_in_force)
        caps = session.capabilities
        if caps is not None:
            tools = sorted(caps.allowed_tools) if caps.allowed_tools is not None else None
            fs = [[g.prefix, g.mode] for g in caps.fs_grants] if caps.fs_grants is not None else None
            policy["capabilities"] = {"tools": tools, "fs": fs}
            if caps.egress_allow is not None:  # absent: the tenant's list when given back
                policy["capabilities"]["egress_allow"] = list(caps.egress_allow)
    return policy


def remembered_from_json(policy: Mapping[str, Any]) -> dict[str, str]:
    """The remembered answers of a stored policy; anything malformed is dropped, not trusted."""
    raw = policy.get("remembered")
    if not isinstance(raw, dict):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(k, str) and v in ("allow", "deny")}


def mode_in_force_from_json(policy: Mapping[str, Any]) -> str | None:
    """The approval mode in force when it differed from the session's own; None otherwise."""
    mode = policy.get("mode_in_force")
    return mode if isinstance(mode, str) and mode else None


def session_fields_from_json(policy: Mapping[str, Any]) -> dict[str, Any]:
    """``build_session`` keywords from a stored policy: ``approval_mode`` and ``capabilities`` (the
    session's, to be intersected again with its tenant's as they are now).

    Raises:
        ValueError: a field is malformed (a damaged row).
    """
    fields: dict[str, Any] = {}
    mode = policy.get("approval_mode")
    if mode is not None:
        if not isinstance(mode, str):
            raise ValueError("approval_mode must be a string")
        fields["approval_mode"] = mode
    caps = policy.get("capabilities")
    if caps is not None:
        if not isinstance(caps, dict):
            raise ValueError("capabilities must be an object")
        tools, fs = caps.get("tools"), caps.get("fs")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, str) for t in tools)):
            raise ValueError("capabilities.tools must be a list of names")
        grants = None
        if fs is not None:
            if not isinstance(fs, list) or not all(
                isinstance(g, list) and len(g) == 2 and isinstance(g[0], str) and g[1] in get_args(GrantMode)
                for g in fs
            ):
                raise ValueError("capabilities.fs must be a list of [prefix, mode]")
            grants = tuple(FsGrant(prefix, mode) for prefix, mode in fs)
        egress = caps.get("egress_allow")
        if egress is not None and not (isinstance(egress, list) and all(isinstance(p, str) for p in egress)):
            raise ValueError("capabilities.egress_allow must be a list of host patterns")
        fields["capabilities"] = Capabilities(
            frozenset(tools) if tools is not None else None,
            grants,
            tuple(egress) if egress is not None else None,
        )
    return fields


def plan_from_json(policy: Mapping[str, Any]) -> list[PlanStep]:
    """The proposed steps of a stored plan, in order; a malformed step ends the list there (the
    steps are numbered, so one missing in the middle would renumber the rest)."""
    raw = policy.get("plan")
    if not isinstance(raw, list):
        return []
    steps: list[PlanStep] = []
    for item in raw[:MAX_PLAN_STEPS]:
        step = _plan_step(item, len(steps) + 1)
        if step is None:
            break
        steps.append(step)
    return steps


def _plan_step(item: Any, number: int) -> PlanStep | None:
    if not isinstance(item, dict) or item.get("step") != number:
        return None
    texts = {key: item.get(key) for key in ("turn_id", "tool_use_id", "tool_name", "side_effect")}
    if not all(isinstance(v, str) and len(v) <= _MAX_ID for v in texts.values()):
        return None
    summary, paths = item.get("input_summary"), item.get("projected_modifications")
    if not isinstance(summary, str) or len(summary) > PLAN_SUMMARY_CHARS + 64:
        return None
    if not isinstance(paths, list) or len(paths) > _MAX_PATHS or not all(isinstance(p, str) for p in paths):
        return None
    return PlanStep(
        step=number,
        turn_id=str(texts["turn_id"]),
        tool_use_id=str(texts["tool_use_id"]),
        tool_name=str(texts["tool_name"]),
        side_effect=str(texts["side_effect"]),
        input_summary=summary,
        projected_modifications=tuple(paths),
    )
