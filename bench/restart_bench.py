"""Restart to serving: ``dispatcher serve`` killed (``kill -9``) or stopped (SIGTERM) with open
sessions, started again on the same home; the time from the new process's start to the first
successful call on a session of the previous life (it re-attaches that session's container).

Uses the Docker backend (containers carry this run's instance label and are swept at the end);
skipped without a daemon.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.env import BenchEnv
from bench.grpc_bench import _check, _docker_answers, _spawn, _stop_server
from bench.table import Row
from dispatcher.client import AsyncDispatcherClient
from dispatcher.config import hash_token

GROUP = "restart"
TARGET_S = 5.0
OPEN_AT_ONCE = 8  # sessions being opened together (each makes a container)


def _config(env: BenchEnv, home: Path, token: str, sessions: int, *, remove: bool) -> Path:
    config: dict[str, Any] = {
        "home": str(home),
        "log": {"format": "json", "level": "warning"},
        "tool_confirmation": {"preset": "autonomous"},
        # No quota volumes: the scratch directory must be removable after the run.
        "sandbox": {"backend": "docker", "instance": env.instance, "workspace_quota": None},
        "shutdown": {"remove_sessions": remove},
        "tenants": [
            {
                "id": "bench",
                "token_sha256": hash_token(token),
                "workspace_root": str(home / "ws"),
                "quotas": {"max_sessions": sessions + 10},
            }
        ],
    }
    path = home / ("config-remove.yaml" if remove else "config.yaml")
    path.write_text(yaml.safe_dump(config))
    return path


def _serve(config: Path) -> tuple[subprocess.Popen[str], str]:
    repo = str(Path(__file__).resolve().parents[1])
    argv = [
        sys.executable,
        "-m",
        "dispatcher.cli",
        "serve",
        "--config",
        str(config),
        "--listen",
        "127.0.0.1:0",
    ]
    return _spawn(argv, repo)


async def _open_sessions(target: str, token: str, n: int) -> list[str]:
    """``n`` sessions, each with a container (one ``shell true`` each)."""
    gate = asyncio.Semaphore(OPEN_AT_ONCE)
    async with AsyncDispatcherClient(target, token=token, timeout=120) as client:

        async def one(i: int) -> str:
            async with gate:
                session = await client.create_session(f"w{i}")
                _check(await client.call(session.session_id, "shell", {"command": "true"}))
                return session.session_id

        return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _restart(config: Path, token: str, session_id: str, n: int) -> tuple[subprocess.Popen[str], float]:
    """Start the server again; seconds from process start to the first call's successful result."""
    started = time.perf_counter()
    proc, target = _serve(config)
    async with AsyncDispatcherClient(target, token=token, timeout=120) as client:
        _check(await client.call(session_id, "shell", {"command": "echo $((6*7))"}))
        elapsed = time.perf_counter() - started
        given_back = len(await client.list_sessions())
    if given_back != n:
        raise RuntimeError(f"{given_back} of {n} sessions came back after the restart")
    return proc, elapsed


async def measure(env: BenchEnv) -> list[Row]:
    """One kill -9 restart and one SIGTERM restart with ``env.concurrency_sessions`` open sessions."""
    if not _docker_answers():
        return [
            Row(GROUP, "restart to serving (skipped)", None, note="no Docker daemon/image", compare=False)
        ]
    n = env.concurrency_sessions
    token = secrets.token_urlsafe(24)
    home = env.workspace("restart-home")
    keep, remove = _config(env, home, token, n, remove=False), _config(env, home, token, n, remove=True)
    rows: list[Row] = []
    proc, target = _serve(keep)
    try:
        sessions = await _open_sessions(target, token, n)
        for how in ("kill -9", "SIGTERM"):
            if how == "kill -9":
                proc.kill()
                proc.wait()
            else:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
            proc, seconds = await _restart(keep if how == "kill -9" else remove, token, sessions[-1], n)
            verdict = "meets" if seconds <= TARGET_S else "MISSES"
            rows.append(
                Row(
                    GROUP,
                    f"restart to serving with {n} open sessions ({how})",
                    seconds * 1000,
                    n=1,
                    note=f"process start -> first call on an existing session; {verdict} the {TARGET_S:.0f} s target",
                    compare=False,
                )
            )
    finally:
        _stop_server(proc)  # the last server removes the sessions (shutdown.remove_sessions)
    return rows
