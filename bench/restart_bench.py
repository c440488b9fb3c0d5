"""Restart with open sessions: ``dispatcher serve`` killed (``kill -9``) or stopped (SIGTERM),
started again on the same home.

Three figures per restart, each from the new process's start: serving (its "serving on" line: the
stored sessions given back, the start-up sweep done), the first successful call on a session of
the previous life (it re-attaches that session's container, ahead of the background sweep), and
every session answering (each one with a container runs ``echo``, ``CALL_AT_ONCE`` at a time, each
one without answers ``GetSession``).

Rows: ``env.concurrency_sessions`` (100) sessions, each with its container; and
``env.restart_large_sessions`` (1,000; 40 with ``--quick``) sessions, each with its container too when the machine has the memory for a thousand
idle containers (``PER_CONTAINER_BYTES`` each, about 15 MiB measured by the ``density`` rows, plus
``HEADROOM_BYTES``). Otherwise (a machine shared with other work) only ``FALLBACK_WITH_CONTAINERS``
(100) of them have one, the others none (created with ``sandbox.start_on_create: false`` and never
called, as sessions whose containers were retired when idle), and the row's label says so.
``BENCH_RESTART_LARGE_CONTAINERS=N`` sets how many have one; ``BENCH_RESTART_LARGE=0`` skips the
large row.

Uses the Docker backend (containers carry this run's instance label and are swept at the end);
skipped without a daemon.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
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
"""Serving, and a session's first call, within this of the process start."""
ALL_TARGET_S = 30.0
"""Every session answering within this of the process start."""
OPEN_AT_ONCE = 8  # sessions being opened together (each makes a container)
CALL_AT_ONCE = 16  # sessions called together after the restart
FALLBACK_WITH_CONTAINERS = 100
PER_CONTAINER_BYTES = 24 << 20
"""Host memory budgeted per idle container (agent, init, shim, server share: ~15 MiB measured)."""
HEADROOM_BYTES = 3 << 30


def _config(
    env: BenchEnv, home: Path, token: str, sessions: int, *, remove: bool, start_on_create: bool = True
) -> Path:
    sandbox: dict[str, Any] = {
        "backend": "docker",
        "instance": env.instance,
        # No quota volumes: the scratch directory must be removable after the run.
        "workspace_quota": None,
        "start_on_create": start_on_create,
    }
    if image := os.environ.get("BENCH_SANDBOX_IMAGE"):  # an image with this tree's agent
        sandbox["image"] = image
    config: dict[str, Any] = {
        "home": str(home),
        "log": {"format": "json", "level": "warning"},
        "tool_confirmation": {"preset": "autonomous"},
        "sandbox": sandbox,
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


async def _open_sessions(target: str, token: str, n: int, with_containers: int) -> list[str]:
    """``n`` sessions; the first ``with_containers`` each get a container (one ``shell true``)."""
    gate = asyncio.Semaphore(OPEN_AT_ONCE)
    async with AsyncDispatcherClient(target, token=token, timeout=120) as client:

        async def one(i: int) -> str:
            async with gate:
                session = await client.create_session(f"w{i}")
                if i < with_containers:
                    _check(await client.call(session.session_id, "shell", {"command": "true"}))
                return session.session_id

        return list(await asyncio.gather(*(one(i) for i in range(n))))


@dataclass(frozen=True)
class Restarted:
    serving_s: float
    first_call_s: float
    all_s: float
    cpu: dict[str, float]
    """CPU seconds spent from the start to every session answering, by who spent it (``_cpu``)."""


_DAEMONS = ("dockerd", "containerd", "containerd-shim", "runc")
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(server_pid: int) -> dict[str, float]:
    """CPU seconds used so far: by Docker (the daemon, containerd, the shims and what they reaped:
    runc and the processes each ``docker exec`` ran), by the sandboxes (processes in a Docker
    cgroup) and by the server. A process-level profile of a restart: which of them the work is."""
    out = {"docker": 0.0, "sandboxes": 0.0, "server": 0.0}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
            with open(f"/proc/{entry}/cgroup", "rb") as f:
                cgroup = f.read()
        except OSError:
            continue
        comm = raw[raw.index(b"(") + 1 : raw.rindex(b")")].decode(errors="replace")
        fields = raw[raw.rindex(b")") + 2 :].split()
        own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        if int(entry) == server_pid:
            out["server"] += own / _TICK
        elif comm.startswith(_DAEMONS):
            out["docker"] += (own + reaped) / _TICK
        elif b"/docker/" in cgroup or b"docker-" in cgroup:
            out["sandboxes"] += own / _TICK
    return out


def _spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: max(0.0, after[k] - before.get(k, 0.0)) for k in after}


async def _restart(
    config: Path, token: str, sessions: list[str], with_containers: int
) -> tuple[subprocess.Popen[str], Restarted]:
    """Start the server again and time it (see the module docstring)."""
    cpu_before = _cpu(0)
    started = time.perf_counter()
    proc, target = _serve(config)
    serving = time.perf_counter() - started
    called, asked = sessions[:with_containers], sessions[with_containers:]
    async with AsyncDispatcherClient(target, token=token, timeout=300) as client:
        _check(await client.call(called[-1], "shell", {"command": "echo $((6*7))"}))
        first = time.perf_counter() - started
        gate = asyncio.Semaphore(CALL_AT_ONCE)

        async def call(session_id: str) -> None:
            async with gate:
                _check(await client.call(session_id, "shell", {"command": "echo $((6*7))"}))

        async def ask(session_id: str) -> None:
            async with gate:
                await client.get_session(session_id)

        await asyncio.gather(*(call(s) for s in called[:-1]), *(ask(s) for s in asked))
        every = time.perf_counter() - started
        cpu = _spent(cpu_before, _cpu(proc.pid))
        given_back = len(await client.list_sessions())
    if given_back != len(sessions):
        raise RuntimeError(f"{given_back} of {len(sessions)} sessions came back after the restart")
    return proc, Restarted(serving, first, every, cpu)


async def _scenario(env: BenchEnv, n: int, with_containers: int, label: str) -> list[Row]:
    """Open ``n`` sessions, then one kill -9 restart and one SIGTERM restart."""
    token = secrets.token_urlsafe(24)
    home = env.workspace(f"restart-home-{n}")
    start = with_containers == n
    keep = _config(env, home, token, n, remove=False, start_on_create=start)
    remove = _config(env, home, token, n, remove=True, start_on_create=start)
    rows: list[Row] = []
    proc, target = _serve(keep)
    try:
        sessions = await _open_sessions(target, token, n, with_containers)
        for how in ("kill -9", "SIGTERM"):
            if how == "kill -9":
                proc.kill()
                proc.wait()
            else:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
            proc, timed = await _restart(
                keep if how == "kill -9" else remove, token, sessions, with_containers
            )
            met = (
                timed.serving_s <= TARGET_S and timed.first_call_s <= TARGET_S and timed.all_s <= ALL_TARGET_S
            )
            rows.append(
                Row(
                    GROUP,
                    f"restart with {label} ({how})",
                    timed.first_call_s * 1000,
                    n=1,
                    note=(
                        f"from process start: serving {timed.serving_s:.1f} s, first call on an old session"
                        f" {timed.first_call_s:.1f} s, every session answering {timed.all_s:.1f} s;"
                        f" {'meets' if met else 'MISSES'} {TARGET_S:.0f} s / {ALL_TARGET_S:.0f} s;"
                        " CPU s in that time: " + ", ".join(f"{k} {v:.1f}" for k, v in timed.cpu.items())
                    ),
                    compare=False,
                )
            )
    finally:
        _stop_server(proc)  # the last server removes the sessions (shutdown.remove_sessions)
    return rows


async def measure(env: BenchEnv) -> list[Row]:
    """The 100-session row and the 1,000-session row (see the module docstring)."""
    if not _docker_answers():
        return [
            Row(GROUP, "restart to serving (skipped)", None, note="no Docker daemon/image", compare=False)
        ]
    n = env.concurrency_sessions
    rows = await _scenario(env, n, n, f"{n} sessions, each with its container")
    if os.environ.get("BENCH_RESTART_LARGE", "1") != "0":
        large = env.restart_large_sessions
        with_containers = _large_with_containers(large)
        label = (
            f"{large:,} sessions, each with its container"
            if with_containers == large
            else f"{large:,} sessions, {with_containers} with a running container (no memory for more)"
        )
        rows += await _scenario(env, large, with_containers, label)
    return rows


def _large_with_containers(sessions: int) -> int:
    """How many of the large row's ``sessions`` get a running container (see the module docstring)."""
    if (chosen := os.environ.get("BENCH_RESTART_LARGE_CONTAINERS")) is not None:
        return max(1, min(sessions, int(chosen)))
    available = 0
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    if available >= sessions * PER_CONTAINER_BYTES + HEADROOM_BYTES:
        return sessions
    return min(sessions, FALLBACK_WITH_CONTAINERS)
