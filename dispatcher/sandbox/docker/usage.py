"""A session's usage on Docker (``GetSessionUsage``): the container's cgroup counters as the
daemon's stats endpoint reports them (cgroup v1 or v2 alike), and the workspace's blocks on disk.

Why the daemon and not the cgroup files: the server may run in a container of its own, without the
host's ``/sys/fs/cgroup``, and the cgroup driver decides where a container's files are; the daemon
knows both. Its one-shot answer carries the previous sample too, so a CPU percentage needs no state
kept here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from dispatcher.core.provider_api import SessionUsage
from dispatcher.sandbox.tree_size import tree_bytes as workspace_bytes

__all__ = ["from_stats", "workspace_bytes"]


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) else 0


def from_stats(stats: Mapping[str, Any], *, now: float | None = None) -> SessionUsage:
    """The usage in one answer of ``GET /containers/{id}/stats?stream=false``."""
    cpu = stats.get("cpu_stats") or {}
    pre = stats.get("precpu_stats") or {}
    total = _int((cpu.get("cpu_usage") or {}).get("total_usage"))
    cpu_delta = total - _int((pre.get("cpu_usage") or {}).get("total_usage"))
    system_delta = _int(cpu.get("system_cpu_usage")) - _int(pre.get("system_cpu_usage"))
    cpus = _int(cpu.get("online_cpus")) or len((cpu.get("cpu_usage") or {}).get("percpu_usage") or ()) or 1
    # The system counter sums every CPU's time: scaled by their number, 100 % is one whole CPU.
    percent = cpu_delta / system_delta * cpus * 100.0 if cpu_delta > 0 and system_delta > 0 else 0.0
    memory = stats.get("memory_stats") or {}
    detail = memory.get("stats") or {}
    # As ``docker stats``: the page cache the kernel could drop is not the session's.
    cache = _int(detail.get("total_inactive_file", detail.get("inactive_file")))
    used = max(_int(memory.get("usage")) - cache, 0)
    limit = _int(memory.get("limit"))
    if limit >= 1 << 62:  # the cgroup's "no limit"
        limit = 0
    return SessionUsage(
        cpu_seconds=total / 1e9,
        cpu_percent=round(percent, 1),
        memory_bytes=used,
        memory_limit_bytes=limit,
        pids=_int((stats.get("pids_stats") or {}).get("current")),
        sample_time=time.time() if now is None else now,
        running=True,
    )
