"""Client verbs that manage sessions' lives: ``close``, ``cancel``, ``renew``, ``pause``, ``resume``,
and the lines ``dispatcher sessions`` prints (state, expiry, idle time, pending confirmations, plan).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from dispatcher.cli.output import EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE, json_line
from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.wire.convert import SessionInfo

ClientFactory = Callable[[argparse.Namespace], DispatcherClient]

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")


def duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``10m``, ``2h``, ``1d`` (an argparse type)."""
    match = _DURATION.match(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a duration such as 90s, 10m, 2h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def human(seconds: float) -> str:
    """``3h05m``, ``4m10s``, ``12s``: a duration as a person reads it."""
    s = max(int(seconds), 0)
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def lifecycle_dict(s: SessionInfo, now: float) -> dict[str, Any]:
    """The lifecycle fields of a session, for ``--json`` output."""
    return {
        "state": "paused" if s.paused else "active",
        "expire_time": s.expire_time,
        "idle_expire_time": s.idle_expire_time,
        "idle_seconds": round(now - s.last_activity_time, 3) if s.last_activity_time else None,
        "pending_request_ids": list(s.pending_request_ids),
    }


def session_line(s: SessionInfo, now: float) -> str:
    """One line of ``dispatcher sessions``."""
    state = "paused" if s.paused else "active"
    expires = f"expires in {human(s.expire_time - now)}" if s.expire_time else "no ttl"
    idle = f"idle {human(now - s.last_activity_time)}" if s.last_activity_time else ""
    if s.idle_expire_time:
        idle += f" (of {human(s.idle_expire_time - s.last_activity_time)})"
    parts = [s.session_id, f"{s.workspace:<16}", state, f"mode={s.approval_mode}", expires, idle]
    if s.pending_request_ids:
        parts.append(f"pending={','.join(s.pending_request_ids)}")
    if s.plan:
        parts.append(f"plan={len(s.plan)} steps")
    return "  ".join(p for p in parts if p)


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: ClientFactory) -> None:
    """Add ``close``, ``cancel``, ``renew``, ``pause`` and ``resume`` to the CLI's sub-parsers."""
    close = verbs.add_parser(
        "close",
        parents=[client_opts],
        help="close sessions (their sandboxes removed; workspaces stay)",
        description="Close the sessions named, those idle for at least --idle-for, or --all of yours.",
    )
    close.add_argument("session_ids", nargs="*", metavar="SESSION")
    close.add_argument(
        "--idle-for", type=duration, metavar="DURATION", help="sessions idle this long (10m, 2h)"
    )
    close.add_argument("--all", action="store_true", help="every session of yours (asks first unless --yes)")
    close.add_argument("--yes", "-y", action="store_true", help="do not ask")
    close.set_defaults(func=lambda args: _close(args, client))

    cancel = verbs.add_parser("cancel", parents=[client_opts], help="cancel a session's running calls")
    cancel.add_argument("session_id", metavar="SESSION")
    cancel.set_defaults(func=lambda args: _simple(args, client, "cancel"))

    renew = verbs.add_parser("renew", parents=[client_opts], help="a new expiry, DURATION from now")
    renew.add_argument("session_id", metavar="SESSION")
    renew.add_argument("duration", type=duration, metavar="DURATION", help="e.g. 2h (0: no expiry)")
    renew.set_defaults(func=lambda args: _simple(args, client, "renew"))

    for verb, text in (("pause", "freeze a session's sandbox (memory kept)"), ("resume", "thaw it")):
        p = verbs.add_parser(verb, parents=[client_opts], help=text)
        p.add_argument("session_id", metavar="SESSION")
        p.set_defaults(func=lambda args, verb=verb: _simple(args, client, verb))


def _simple(args: argparse.Namespace, client: ClientFactory, verb: str) -> int:
    with client(args) as c:
        if verb == "cancel":
            c.cancel(args.session_id)
            info = None
        elif verb == "renew":
            info = c.renew_session(args.session_id, round(args.duration))
        elif verb == "pause":
            info = c.pause_session(args.session_id)
        else:
            info = c.resume_session(args.session_id)
    now = time.time()
    if args.json:
        json_line({"session_id": args.session_id, **(lifecycle_dict(info, now) if info else {})})
    elif info is None:
        print(f"{args.session_id}: running calls cancelled")
    else:
        print(session_line(info, now))
    return EXIT_OK


def _close(args: argparse.Namespace, client: ClientFactory) -> int:
    if not (args.session_ids or args.all or args.idle_for is not None):
        print("dispatcher: close: name sessions, or give --idle-for or --all", file=sys.stderr)
        return EXIT_USAGE
    failed = 0
    with client(args) as c:
        targets = list(args.session_ids)
        if args.all or args.idle_for is not None:
            now = time.time()
            for s in c.list_sessions():
                idle = now - s.last_activity_time if s.last_activity_time else 0.0
                if args.all or idle >= args.idle_for:
                    targets.append(s.session_id)
            if args.all and targets and not args.yes and not _confirmed(len(targets)):
                print("dispatcher: nothing closed", file=sys.stderr)
                return EXIT_TOOL_ERROR
        for sid in dict.fromkeys(targets):
            try:
                c.close_session(sid)
            except RequestFailed as exc:
                failed += 1
                print(f"dispatcher: {sid}: {exc.code}: {exc.details}", file=sys.stderr)
                continue
            if args.json:
                json_line({"closed": sid})
            else:
                print(f"closed {sid}")
    return EXIT_TOOL_ERROR if failed else EXIT_OK


def _confirmed(count: int) -> bool:
    if not sys.stdin.isatty():
        print(f"dispatcher: close --all would close {count} sessions: add --yes", file=sys.stderr)
        return False
    reply = input(f"close all {count} of your sessions? [y/N] ").strip().lower()
    return reply in ("y", "yes")
