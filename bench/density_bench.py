"""Idle density: host memory per idle session, and idle sessions per GiB.

A ``dispatcher serve`` (Docker backend, ``start_on_create`` as by default) opens N sessions; each
answers one ``shell true`` (so its container runs and its agent is connected), then all sit idle.
Per session it reads:

- the agent: the proportional set size (PSS) of the processes in the container (the agent and
  the init), from ``/proc/PID/smaps_rollup`` on the host;
- the container: its cgroup's memory minus page cache (``memory.current`` less ``file`` on cgroup
  v2, ``usage_in_bytes`` less ``cache`` on v1), what the kernel charges it beyond shared files;
- the runtime: the PSS of its ``containerd-shim`` process (one per container under runc);
- the server: the growth of the server's RSS from one open session to N, divided by N - 1.

Host memory per idle session is container + shim + server (the agent is inside the container's
figure); sessions per GiB is 1 GiB over it. Needs a Docker daemon and root (to read other
processes' smaps); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import statistics
import subprocess
from collections.abc import Iterable
from pathlib import Path

import docker

from bench.env import BenchEnv
from bench.grpc_bench import _check, _docker_answers, _start_server, _stop_server
from bench.table import Row
from dispatcher.client import AsyncDispatcherClient

GROUP = "density"
MIB = 1 << 20


def _pss(pid: int) -> int:
    """Bytes of ``pid``'s proportional set size (0 if it is gone or unreadable)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _shims() -> dict[str, int]:
    """Container id -> pid of its containerd shim."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=False).stdout
    found: dict[str, int] = {}
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "containerd-shim" not in args:
            continue
        words = args.split()
        if "-id" in words:
            found[words[words.index("-id") + 1]] = int(pid)
    return found


def _cgroup_bytes(stats: dict[str, object]) -> int:
    """Charged memory less page cache, from a ``docker stats`` snapshot (cgroup v1 or v2)."""
    memory = stats.get("memory_stats")
    if not isinstance(memory, dict):
        return 0
    usage = int(memory.get("usage", 0))
    detail = memory.get("stats") or {}
    assert isinstance(detail, dict)
    cache = int(detail["file"] if "file" in detail else detail.get("cache", 0))
    return max(0, usage - cache)


def _per_container(ids: Iterable[str]) -> tuple[list[int], list[int], list[int]]:
    """(agent PSS, cgroup bytes, shim PSS) of each container."""
    client = docker.from_env()
    shims = _shims()
    agents, cgroups, shim_pss = [], [], []
    try:
        for cid in ids:
            container = client.containers.get(cid)
            top = container.top(ps_args="-o pid")
            pids = [int(p[0]) for p in top.get("Processes") or []]
            agents.append(sum(_pss(p) for p in pids))
            cgroups.append(_cgroup_bytes(container.stats(stream=False)))
            shim = shims.get(container.id)
            shim_pss.append(_pss(shim) if shim is not None else 0)
    finally:
        client.close()
    return agents, cgroups, shim_pss


def _containers(instance: str) -> list[str]:
    client = docker.from_env()
    try:
        found = client.containers.list(
            filters={"label": f"dispatcher.instance={instance}"}, ignore_removed=True
        )
        return [c.id for c in found if c.labels.get("dispatcher.session")]
    finally:
        client.close()


async def measure(env: BenchEnv) -> list[Row]:
    """Rows: agent, container, shim and server memory per idle session; sessions per GiB."""
    if os.geteuid() != 0 or not _docker_answers():
        return [Row(GROUP, "idle sessions per GiB", None, note="skipped: needs root and a Docker daemon")]
    n = env.density_sessions
    token = secrets.token_urlsafe(24)
    proc, target = _start_server(env, token, "docker")
    try:
        async with AsyncDispatcherClient(target, token=token) as client:

            async def open_one(i: int) -> None:
                sid = (await client.create_session(f"idle-{i}")).session_id
                _check(await client.call(sid, "shell", {"command": "true"}))

            await open_one(0)  # the server's one-time costs (imports, first container) land here
            await asyncio.sleep(1.0)
            server_one = _rss(proc.pid)
            for start in range(1, n, 8):  # a few at a time, as a busy platform would
                await asyncio.gather(*(open_one(i) for i in range(start, min(n, start + 8))))
            await asyncio.sleep(2.0)  # let the agents settle into idle
            server_n = _rss(proc.pid)
            agents, cgroups, shims = await asyncio.to_thread(_per_container, _containers(env.instance))
    finally:
        _stop_server(proc)
    server_each = max(0, server_n - server_one) / max(1, n - 1)
    agent, cgroup, shim = (statistics.median(v) if v else 0 for v in (agents, cgroups, shims))
    host = cgroup + shim + server_each
    note = f"{len(cgroups)} idle sessions, median per session"
    return [
        Row(
            GROUP,
            "idle session: agent + init PSS (MiB)",
            None,
            note=f"{agent / MIB:.1f} MiB; {note}",
            compare=False,
        ),
        Row(
            GROUP,
            "idle session: container memory less cache (MiB)",
            None,
            note=f"{cgroup / MIB:.1f} MiB (includes the agent); {note}",
            compare=False,
        ),
        Row(GROUP, "idle session: runtime shim PSS (MiB)", None, note=f"{shim / MIB:.1f} MiB", compare=False),
        Row(
            GROUP,
            "idle session: server memory (MiB)",
            None,
            note=f"{server_each / MIB:.2f} MiB (server RSS growth, 1 -> {n} sessions, per session)",
            compare=False,
        ),
        Row(
            GROUP,
            "idle sessions per GiB of host memory",
            None,
            note=f"{(1 << 30) / host:.0f} (container + shim + server = {host / MIB:.1f} MiB each; goal >= 40)"
            if host
            else "not measured",
            compare=False,
        ),
    ]
