"""Client verbs about a session's policy: ``create`` (approval mode, narrower capabilities) and
``plan`` (approve or reject a plan-mode session's proposed steps)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from dispatcher.client import DispatcherClient
from dispatcher.core.approval.modes import ApprovalMode
from dispatcher.core.sessions.state import PlanStep
from dispatcher.wire.convert import SessionInfo

ClientFactory = Callable[[argparse.Namespace], DispatcherClient]


def session_dict(s: SessionInfo) -> dict[str, Any]:
    """A session for ``dispatcher sessions --json``."""
    return {
        "session_id": s.session_id,
        "workspace": s.workspace,
        "workspace_path": s.workspace_path,
        "role": str(s.role),
        "labels": dict(s.labels),
        "create_time": s.create_time,
        "last_event_seq": s.last_event_seq,
        **session_policy_dict(s),
    }


def session_policy_dict(s: SessionInfo) -> dict[str, Any]:
    """The policy fields of a session, for ``--json`` output."""
    caps = s.capabilities
    return {
        "approval_mode": s.approval_mode,
        "tools": sorted(caps.allowed_tools) if caps.allowed_tools is not None else None,
        "fs": [{"path": g.prefix, "mode": g.mode} for g in caps.fs_grants]
        if caps.fs_grants is not None
        else None,
        "plan": [_step_dict(step) for step in s.plan],
    }


def _step_dict(step: PlanStep) -> dict[str, Any]:
    return {
        "step": step.step,
        "tool_name": step.tool_name,
        "side_effect": step.side_effect,
        "input_summary": step.input_summary,
        "projected_modifications": list(step.projected_modifications),
    }


def _grant(text: str) -> tuple[str, str]:
    path, sep, mode = text.rpartition(":")
    if not sep or mode not in ("r", "rw"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected PATH:r or PATH:rw")
    return path or ".", mode


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: ClientFactory) -> None:
    """Add ``create`` and ``plan`` to the CLI's sub-parsers."""
    create = verbs.add_parser(
        "create", parents=[client_opts], help="create a session (approval mode, narrower capabilities)"
    )
    create.add_argument("workspace", metavar="WORKSPACE", nargs="?", default="", help="default: default")
    create.add_argument(
        "--mode", choices=[m.value for m in ApprovalMode], help="approval mode (default: cautious)"
    )
    create.add_argument(
        "--tools", metavar="A,B", help="only these tools (each must be allowed to the tenant)"
    )
    create.add_argument(
        "--fs", metavar="PATH:r|rw", action="append", type=_grant, help="only this grant (repeatable)"
    )
    create.add_argument("--label", metavar="K=V", action="append", default=[], help="a label (repeatable)")
    create.set_defaults(func=lambda args: _create(args, client))

    plan = verbs.add_parser(
        "plan", parents=[client_opts], help="show, approve or reject a plan-mode session's plan"
    )
    plan.add_argument("session_id", metavar="SESSION")
    plan.add_argument("decision", choices=("show", "approve", "reject"))
    plan.set_defaults(func=lambda args: _plan(args, client))


def _create(args: argparse.Namespace, client: ClientFactory) -> int:
    labels = dict(item.split("=", 1) if "=" in item else (item, "") for item in args.label)
    tools = [t for t in args.tools.split(",") if t] if args.tools is not None else None
    with client(args) as c:
        info = c.create_session(args.workspace, labels=labels, mode=args.mode, tools=tools, fs=args.fs)
    if args.json:
        print(
            json.dumps(
                {"session_id": info.session_id, "workspace": info.workspace, **session_policy_dict(info)}
            )
        )
    else:
        print(f"{info.session_id}  {info.workspace}  mode={info.approval_mode}")
    return 0


def _plan(args: argparse.Namespace, client: ClientFactory) -> int:
    if args.decision == "show":
        with client(args) as c:
            info = c.get_session(args.session_id)
        if args.json:
            print(
                json.dumps({"steps": [_step_dict(s) for s in info.plan], "approval_mode": info.approval_mode})
            )
        else:
            print(f"{len(info.plan)} proposed steps; the session is {info.approval_mode}", file=sys.stderr)
            _print_steps(info.plan)
        return 0
    with client(args) as c:
        steps, mode = c.approve_plan(args.session_id, args.decision == "approve")
    if args.json:
        print(json.dumps({"steps": [_step_dict(s) for s in steps], "approval_mode": mode}))
        return 0
    verb = "approved" if args.decision == "approve" else "rejected"
    print(f"plan {verb} ({len(steps)} steps); the session is now {mode}", file=sys.stderr)
    _print_steps(steps)
    return 0


def _print_steps(steps: Sequence[PlanStep]) -> None:
    for step in steps:
        print(f"{step.step:>3}. {step.tool_name} ({step.side_effect}): {step.input_summary.splitlines()[-1]}")
