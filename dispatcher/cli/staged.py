"""``dispatcher staged SESSION [show|apply|discard] [ID...]``: a review or audit session's staged
writes, as a human sees and decides them (``ListStagedChanges``, ``ApplyStagedChanges``,
``DiscardStagedChanges``). No ids: every staged change."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

from dispatcher.cli.output import EXIT_OK, EXIT_TOOL_ERROR, json_line
from dispatcher.client import DispatcherClient
from dispatcher.core.text.visible import visible
from dispatcher.wire.convert_staged import StagedChangeInfo

ClientFactory = Callable[[argparse.Namespace], DispatcherClient]


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: ClientFactory) -> None:
    """Add ``staged`` to the CLI's sub-parsers."""
    staged = verbs.add_parser(
        "staged",
        parents=[client_opts],
        help="show, apply or discard a review/audit session's staged writes",
        description=(
            "show (default): each staged change with its unified diff; apply: write them (review: "
            "per file; audit: all or none), each only over the content it was staged over; "
            "discard: drop them. No ids: all of them."
        ),
    )
    staged.add_argument("session_id", metavar="SESSION")
    staged.add_argument("action", nargs="?", choices=("show", "apply", "discard"), default="show")
    staged.add_argument("ids", nargs="*", metavar="ID", help="staged change ids (default: all)")
    staged.set_defaults(func=lambda args: _staged(args, client))


def _staged(args: argparse.Namespace, client: ClientFactory) -> int:
    with client(args) as c:
        if args.action == "show":
            changes = c.list_staged(args.session_id)
            wanted = set(args.ids)
            _show([ch for ch in changes if not wanted or ch.id in wanted], args.json)
            return EXIT_OK
        if args.action == "discard":
            dropped = c.discard_staged(args.session_id, args.ids)
            if args.json:
                json_line({"discarded": dropped})
            else:
                print(f"discarded {len(dropped)}: {' '.join(dropped)}".rstrip(": "))
            return EXIT_OK
        result = c.apply_staged(args.session_id, args.ids)
    if args.json:
        json_line(
            {"applied": list(result.applied_ids), "refused": [dataclasses.asdict(r) for r in result.refused]}
        )
    else:
        for change_id in result.applied_ids:
            print(f"applied {change_id}")
        for refusal in result.refused:
            print(f"refused {refusal.id} ({visible(refusal.path)}): {refusal.reason}", file=sys.stderr)
    return EXIT_TOOL_ERROR if result.refused else EXIT_OK


def _show(changes: list[StagedChangeInfo], as_json: bool) -> None:
    if as_json:
        for ch in changes:
            json_line(dataclasses.asdict(ch))
        return
    if not changes:
        print("no staged changes", file=sys.stderr)
    for ch in changes:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ch.stage_time))
        print(
            f"{ch.id}  {ch.kind}  {visible(ch.path, escape_backslash=True)}  ({ch.size:,} bytes, "
            f"staged {when} by {ch.tool_name})"
        )
        print(visible(ch.diff, keep_newlines=True).rstrip("\n"))
