"""Fork and snapshot against a fresh start: what one prepared session is worth as N.

A ``dispatcher serve`` (Docker backend, no warm pool) and a parent session whose workspace is a
30 MB tree (300 files of 100 KB, uploaded) and whose ``$HOME`` (in /tmp) holds 1 MB more, as a
setup would leave it. Rows, in one run:

- ``SnapshotSession`` of that parent (the container frozen for the copy; workspace and /tmp);
- ``ForkSession`` of 8 children, each then making one ``shell true`` call: per child, from just
  before ForkSession to its first result (p50), and the time until all 8 had theirs;
- the same 8 made the old way: CreateSession, UploadFiles of the same tree and one ``shell true``
  each, all at once; same figures.

Each way runs ``ROUNDS`` times, alternated, children closed between rounds.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

from bench.env import BenchEnv
from bench.grpc_bench import _check, _docker_answers, _start_server, _stop_server
from bench.table import Row, percentile
from dispatcher.client import AsyncDispatcherClient
from dispatcher.wire.convert import SessionInfo

GROUP = "snapshot"
CHILDREN = 8
ROUNDS = int(os.environ.get("BENCH_FORK_ROUNDS", "3"))
FILES, FILE_BYTES = 300, 100_000


def _tree(root: Path) -> Path:
    tree = root / "fork-tree"
    if not tree.is_dir():
        for i in range(FILES):
            sub = tree / f"d{i % 10}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"f{i}.bin").write_bytes(os.urandom(FILE_BYTES))
    return tree


async def measure(env: BenchEnv) -> list[Row]:
    """Rows: snapshot time; fork of 8 (p50 per child, all 8); 8 sessions with an upload."""
    if not _docker_answers():
        return [Row(GROUP, "fork of 8 children", None, note="skipped: no Docker")]
    tree = _tree(env.scratch)
    token = secrets.token_urlsafe(24)
    proc, target = _start_server(
        env,
        token,
        "docker",
        extra={"shutdown": {"remove_sessions": True}},
        sandbox_options={"workspace_quota": None},
    )
    snaps: list[float] = []
    fork_child: list[float] = []
    fork_all: list[float] = []
    fresh_child: list[float] = []
    fresh_all: list[float] = []
    try:
        async with AsyncDispatcherClient(target, token=token) as client:
            parent = (await client.create_session("fork-parent")).session_id
            await client.upload(parent, str(tree), ".")
            _check(
                await client.call(
                    parent, "shell", {"command": 'head -c 1000000 /dev/urandom > "$HOME/setup"'}
                )
            )

            for _ in range(ROUNDS):
                started = time.perf_counter()
                snap = await client.snapshot_session(parent, "bench")
                snaps.append((time.perf_counter() - started) * 1000)
                await client.delete_snapshot(snap.snapshot_id)

            async def first_result(sid: str, started: float, out: list[float]) -> None:
                _check(await client.call(sid, "shell", {"command": "true"}))
                out.append((time.perf_counter() - started) * 1000)

            for r in range(ROUNDS):
                # Forked.
                started = time.perf_counter()
                results = await client.fork_session(parent, CHILDREN)
                kids = [k.session_id for k in results if isinstance(k, SessionInfo)]
                if len(kids) != CHILDREN:
                    raise RuntimeError(f"fork made {len(kids)} of {CHILDREN} children: {results}")
                mine: list[float] = []
                await asyncio.gather(*(first_result(k, started, mine) for k in kids))
                fork_child.extend(mine)
                fork_all.append(max(mine))
                await asyncio.gather(*(client.close_session(k) for k in kids))

                # Fresh sessions with the same tree uploaded.
                started = time.perf_counter()
                mine = []

                async def fresh(name: str, started: float, out: list[float]) -> str:
                    sid = (await client.create_session(name)).session_id
                    await client.upload(sid, str(tree), ".")
                    await first_result(sid, started, out)
                    return sid

                fresh_ids = await asyncio.gather(
                    *(fresh(f"fresh-{r}-{i}", started, mine) for i in range(CHILDREN))
                )
                fresh_child.extend(mine)
                fresh_all.append(max(mine))
                await asyncio.gather(*(client.close_session(s) for s in fresh_ids))
    finally:
        _stop_server(proc)
    mb = FILES * FILE_BYTES / 1e6
    ratio = percentile(fresh_all, 0.5) / percentile(fork_all, 0.5)
    return [
        Row(
            GROUP,
            f"SnapshotSession, {mb:.0f} MB workspace + 1 MB $HOME",
            percentile(snaps, 0.5),
            percentile(snaps, 0.95),
            len(snaps),
            note="container frozen for the copy; cp --reflink=auto (a plain copy on this filesystem unless it is btrfs/xfs)",
            compare=False,
        ),
        Row(
            GROUP,
            f"ForkSession of {CHILDREN} → each child's first result (per child)",
            percentile(fork_child, 0.5),
            percentile(fork_child, 0.95),
            len(fork_child),
            note=f"all {CHILDREN} first results: p50 {percentile(fork_all, 0.5):.0f} ms over {ROUNDS} rounds",
            compare=False,
        ),
        Row(
            GROUP,
            f"{CHILDREN} x (CreateSession + UploadFiles {mb:.0f} MB) → first result (per session)",
            percentile(fresh_child, 0.5),
            percentile(fresh_child, 0.95),
            len(fresh_child),
            note=f"all {CHILDREN}: p50 {percentile(fresh_all, 0.5):.0f} ms; fork is {ratio:.1f}x faster to all {CHILDREN}"
            " (and the fork's children also have the parent's $HOME, the fresh ones do not)",
            compare=False,
        ),
    ]
