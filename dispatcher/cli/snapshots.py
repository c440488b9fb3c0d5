"""``dispatcher snapshot SESSION [NAME]``, ``dispatcher snapshots`` (``--delete ID``) and
``dispatcher fork SESSION|SNAPSHOT N``."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from dispatcher.cli.output import EXIT_OK, EXIT_TOOL_ERROR, json_line
from dispatcher.cli.usage import size
from dispatcher.client import DispatcherClient
from dispatcher.wire.convert_snapshots import ForkFailure, SnapshotInfo

ClientFactory = Callable[[argparse.Namespace], DispatcherClient]


def snapshot_dict(s: SnapshotInfo) -> dict[str, Any]:
    return {
        "snapshot_id": s.snapshot_id,
        "name": s.name,
        "source_session_id": s.source_session_id,
        "create_time": s.create_time,
        "size_bytes": s.size_bytes,
    }


def snapshot_line(s: SnapshotInfo) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.create_time))
    return f"{s.snapshot_id}  {size(s.size_bytes):>8}  {when}  from {s.source_session_id}  {s.name}".rstrip()


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: ClientFactory) -> None:
    """Add ``snapshot``, ``snapshots`` and ``fork`` to the CLI's sub-parsers."""
    snap = verbs.add_parser(
        "snapshot",
        parents=[client_opts],
        help="copy a session's workspace and /tmp into a snapshot (not memory or processes)",
    )
    snap.add_argument("session_id", metavar="SESSION")
    snap.add_argument("name", nargs="?", default="", metavar="NAME")
    snap.set_defaults(func=lambda args: _snapshot(args, client))

    listing = verbs.add_parser("snapshots", parents=[client_opts], help="list your snapshots (or delete one)")
    listing.add_argument("--delete", metavar="SNAPSHOT", help="delete this snapshot and its files")
    listing.set_defaults(func=lambda args: _snapshots(args, client))

    fork = verbs.add_parser(
        "fork",
        parents=[client_opts],
        help="N new sessions from a session (frozen for the copy) or a snapshot (snap_...)",
    )
    fork.add_argument("source", metavar="SESSION|SNAPSHOT")
    fork.add_argument("count", type=int, metavar="N")
    fork.set_defaults(func=lambda args: _fork(args, client))


def _snapshot(args: argparse.Namespace, client: ClientFactory) -> int:
    with client(args) as c:
        info = c.snapshot_session(args.session_id, args.name)
    if args.json:
        json_line(snapshot_dict(info))
    else:
        print(snapshot_line(info))
    return EXIT_OK


def _snapshots(args: argparse.Namespace, client: ClientFactory) -> int:
    with client(args) as c:
        if args.delete:
            freed = c.delete_snapshot(args.delete)
            if args.json:
                json_line({"snapshot_id": args.delete, "freed_bytes": freed})
            else:
                print(f"{args.delete}: deleted, {size(freed)} freed")
            return EXIT_OK
        found = c.list_snapshots()
    for s in found:
        if args.json:
            json_line(snapshot_dict(s))
        else:
            print(snapshot_line(s))
    return EXIT_OK


def _fork(args: argparse.Namespace, client: ClientFactory) -> int:
    with client(args) as c:
        if args.source.startswith("snap_"):
            results = c.fork_session(snapshot_id=args.source, count=args.count)
        else:
            results = c.fork_session(args.source, args.count)
    failed = 0
    for i, r in enumerate(results):
        if isinstance(r, ForkFailure):
            failed += 1
            if args.json:
                json_line({"child": i, "error": {"code": r.code, "message": r.message}})
            else:
                print(f"child {i}: {r.code}: {r.message}")
        elif args.json:
            json_line({"child": i, "session_id": r.session_id, "workspace": r.workspace})
        else:
            print(f"{r.session_id}  {r.workspace}")
    return EXIT_TOOL_ERROR if failed else EXIT_OK
