"""Server memory under a repeated load: the same load ten times on one session of one server, the
server's RSS after each round.

One round: ``SHELL_CALLS`` shell calls printing 1 MB each (``CALLS_AT_ONCE`` at a time, through
Dispatch, with ``state.db`` storing every output delta as a restartable server does), then
``BIG_TURN_DISPATCHES`` Dispatches whose ``turn_id`` is 3.5 MB (refused: a turn id is bounded; the
request is still received and decoded). A bounded server's RSS grows over the first rounds (event
history and the allocator's arenas filling to their bounds) and then stays flat.

Uses the Docker backend; skipped without a daemon.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.caller_output_bench import rss
from bench.env import BenchEnv
from bench.grpc_bench import _check, _docker_answers, _spawn, _stop_server
from bench.table import Row
from dispatcher.client import AsyncDispatcherClient
from dispatcher.client.base import RequestFailed
from dispatcher.config import hash_token

GROUP = "memory"
ROUNDS = 10
SHELL_CALLS = 150
CALLS_AT_ONCE = 4
PRINTED = 1_000_000
BIG_TURN_DISPATCHES = 40
BIG_TURN_ID = 3_500_000
SETTLE_S = 1.0
"""Pause after a round before RSS is read (the state writer's last batch, freed buffers)."""
MIB = 1 << 20


def _config(env: BenchEnv, home: Path, token: str) -> Path:
    sandbox: dict[str, Any] = {"backend": "docker", "instance": env.instance, "workspace_quota": None}
    if image := os.environ.get("BENCH_SANDBOX_IMAGE"):
        sandbox["image"] = image
    config: dict[str, Any] = {
        "home": str(home),
        "log": {"format": "json", "level": "warning"},
        "tool_confirmation": {"preset": "autonomous"},
        "sandbox": sandbox,
        "tenants": [
            {
                "id": "bench",
                "token_sha256": hash_token(token),
                "workspace_root": str(home / "ws"),
                "quotas": {"max_concurrent_dispatches": CALLS_AT_ONCE + 4},
            }
        ],
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def serve_argv(config: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dispatcher.cli",
        "serve",
        "--config",
        str(config),
        "--listen",
        "127.0.0.1:0",
    ]


async def one_round(client: AsyncDispatcherClient, session_id: str) -> None:
    """The load of one round (see the module docstring)."""
    gate = asyncio.Semaphore(CALLS_AT_ONCE)
    command = f"head -c {PRINTED} /dev/zero | tr '\\0' x"

    async def shell() -> None:
        async with gate:
            _check(await client.call(session_id, "shell", {"command": command}))

    await asyncio.gather(*(shell() for _ in range(SHELL_CALLS)))
    turn_id = "t" * BIG_TURN_ID
    for _ in range(BIG_TURN_DISPATCHES):
        try:
            await client.call(session_id, "shell", {"command": "true"}, turn_id=turn_id)
        except RequestFailed as exc:
            if exc.code != "INVALID_ARGUMENT":
                raise
        else:
            raise RuntimeError("a 3.5 MB turn_id was accepted")


def state_bytes(home: Path) -> int:
    """The size of the server's ``state.db`` with its write-ahead log."""
    return sum(p.stat().st_size for p in home.glob("state.db*"))


async def rounds(
    target: str, token: str, pid: int, after_round: Callable[[int], None] = lambda n: None
) -> list[int]:
    """RSS of the server (bytes) before the first round and after each of ``ROUNDS``."""
    async with AsyncDispatcherClient(target, token=token, timeout=300) as client:
        session_id = (await client.create_session("mem")).session_id
        _check(await client.call(session_id, "shell", {"command": "true"}))
        await asyncio.sleep(SETTLE_S)
        figures = [rss(pid)]
        for n in range(1, ROUNDS + 1):
            started = time.perf_counter()
            await one_round(client, session_id)
            await asyncio.sleep(SETTLE_S)
            figures.append(rss(pid))
            after_round(n)
            print(
                f"  memory round {n}: server RSS {figures[-1] / MIB:.0f} MiB"
                f" ({time.perf_counter() - started:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
        await client.close_session(session_id)
    return figures


async def measure(env: BenchEnv) -> list[Row]:
    """Ten rounds of the load; one row with the RSS of every round."""
    if not _docker_answers():
        return [Row(GROUP, "server RSS per round (skipped)", None, note="needs Docker and the sandbox image")]
    token = secrets.token_urlsafe(24)
    home = env.workspace("memory-home")
    config = _config(env, home, token)
    proc, target = _spawn(serve_argv(config), str(Path(__file__).resolve().parents[1]))
    stored: list[int] = []
    try:
        figures = await rounds(target, token, proc.pid, lambda n: stored.append(state_bytes(home)))
    finally:
        _stop_server(proc)
    mib = [f / MIB for f in figures]
    later = mib[2:]  # from the end of the second round
    spread = max(later) - min(later)
    return [
        Row(
            GROUP,
            f"server RSS over {ROUNDS} rounds ({SHELL_CALLS} x 1 MB shell + {BIG_TURN_DISPATCHES} x 3.5 MB turn_id)",
            None,
            n=ROUNDS,
            note=(
                "start, then each round: "
                + " -> ".join(f"{m:.0f}" for m in mib)
                + f" MiB; rounds 2-{ROUNDS} within {spread:.0f} MiB; state.db"
                + f" {min(stored) / MIB:.0f}-{max(stored) / MIB:.0f} MiB after each round"
            ),
            compare=False,
        )
    ]
