"""``dispatcher top``: your sessions sorted by the CPU they use, refreshing (``GetSessionUsage``)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dispatcher.cli.output import EXIT_OK, json_line
from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.core.provider_api import SessionUsage

ClientFactory = Callable[[argparse.Namespace], DispatcherClient]

READERS = 8
"""Sessions measured at once (each answer takes about a second)."""


def size(n: int) -> str:
    """``512B``, ``3.1K``, ``250.0M``, ``1.2G``."""
    value = float(n)
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            return f"{int(value)}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    raise AssertionError("unreachable")


def usage_dict(session_id: str, used: SessionUsage) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "running": used.running,
        "cpu_percent": used.cpu_percent,
        "cpu_seconds": round(used.cpu_seconds, 3),
        "memory_bytes": used.memory_bytes,
        "memory_limit_bytes": used.memory_limit_bytes,
        "disk_bytes": used.disk_bytes,
        "disk_limit_bytes": used.disk_limit_bytes,
        "pids": used.pids,
        "egress_bytes_sent": used.egress_bytes_sent,
        "egress_bytes_received": used.egress_bytes_received,
        "sample_time": used.sample_time,
    }


HEADER = f"{'SESSION':<28} {'CPU%':>6} {'CPU s':>8} {'MEM':>8} {'/LIMIT':>8} {'DISK':>8} {'PIDS':>5} {'NET out/in':>15}"


def usage_line(session_id: str, used: SessionUsage) -> str:
    """One row of ``dispatcher top``."""
    limit = size(used.memory_limit_bytes) if used.memory_limit_bytes else "-"
    net = f"{size(used.egress_bytes_sent)}/{size(used.egress_bytes_received)}"
    row = (
        f"{session_id:<28} {used.cpu_percent:>6.1f} {used.cpu_seconds:>8.1f} {size(used.memory_bytes):>8}"
        f" {limit:>8} {size(used.disk_bytes):>8} {used.pids:>5} {net:>15}"
    )
    return row if used.running else row + "  (no container)"


def measure(client: DispatcherClient) -> list[tuple[str, SessionUsage | str]]:
    """Every session of the caller's with its usage (or why it could not be read), highest CPU
    first."""
    ids = [s.session_id for s in client.list_sessions()]

    def one(session_id: str) -> SessionUsage | str:
        try:
            return client.session_usage(session_id)
        except RequestFailed as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=READERS) as pool:
        rows = list(zip(ids, pool.map(one, ids), strict=True))
    return sorted(rows, key=lambda r: -r[1].cpu_percent if isinstance(r[1], SessionUsage) else 1.0)


def render(rows: Sequence[tuple[str, SessionUsage | str]]) -> list[str]:
    lines = [HEADER]
    for session_id, used in rows:
        lines.append(
            usage_line(session_id, used) if isinstance(used, SessionUsage) else f"{session_id:<28} {used}"
        )
    return lines


def add_verbs(verbs: Any, client_opts: argparse.ArgumentParser, client: ClientFactory) -> None:
    """Add ``top`` to the CLI's sub-parsers."""
    top = verbs.add_parser(
        "top",
        parents=[client_opts],
        help="your sessions sorted by CPU: memory, disk, processes, egress (refreshing)",
        description="What each of your sessions uses, highest CPU first, refreshed until Ctrl-C.",
    )
    top.add_argument("--once", action="store_true", help="print one sample and exit")
    top.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="between refreshes (default 2)"
    )
    top.set_defaults(func=lambda args: _top(args, client))


def _top(args: argparse.Namespace, client: ClientFactory) -> int:
    try:
        with client(args) as c:
            _loop(args, c)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


def _loop(args: argparse.Namespace, c: DispatcherClient) -> None:
    while True:
        rows = measure(c)
        if args.json:
            for session_id, used in rows:
                if isinstance(used, SessionUsage):
                    json_line(usage_dict(session_id, used))
                else:
                    json_line({"session_id": session_id, "error": used})
        else:
            if not args.once and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[2J")  # the terminal cleared: one table in place
            print("\n".join(render(rows)), flush=True)
        if args.once:
            return
        time.sleep(max(args.interval, 0.0))
