"""A session's usage from the daemon's stats answer (cgroup v1 and v2 shapes) and a workspace's
blocks on disk."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dispatcher.sandbox import tree_size
from dispatcher.sandbox.docker.usage import from_stats, workspace_bytes

V1: dict[str, Any] = {  # as this machine's daemon answered for a loop in a 512m container
    "cpu_stats": {
        "cpu_usage": {"total_usage": 1_232_220_937, "percpu_usage": [242_131_019, 990_089_918]},
        "system_cpu_usage": 25_739_090_000_000,
        "online_cpus": 2,
    },
    "precpu_stats": {
        "cpu_usage": {"total_usage": 232_220_937},
        "system_cpu_usage": 25_737_090_000_000,
        "online_cpus": 2,
    },
    "memory_stats": {
        "usage": 60_000_000,
        "limit": 536_870_912,
        "stats": {"total_inactive_file": 4_000_000, "inactive_file": 4_000_000, "rss": 55_939_072},
    },
    "pids_stats": {"current": 3},
}

V2: dict[str, Any] = {  # cgroup v2: no percpu list, inactive_file without the total_ prefix
    "cpu_stats": {
        "cpu_usage": {"total_usage": 5_000_000_000},
        "system_cpu_usage": 4_000_000_000,
        "online_cpus": 4,
    },
    "precpu_stats": {"cpu_usage": {"total_usage": 4_500_000_000}, "system_cpu_usage": 0},
    "memory_stats": {
        "usage": 10_000_000,
        "limit": 9_223_372_036_854_771_712,
        "stats": {"inactive_file": 1_000_000},
    },
    "pids_stats": {"current": 7},
}


def test_cgroup_v1_stats() -> None:
    used = from_stats(V1, now=100.0)
    # 1 s of CPU over 2 s of system time (2 CPUs, 1 s of wall time): one whole CPU.
    assert used.cpu_percent == 100.0
    assert used.cpu_seconds == 1.232220937
    assert used.memory_bytes == 56_000_000  # the droppable page cache left out
    assert used.memory_limit_bytes == 536_870_912
    assert used.pids == 3
    assert used.sample_time == 100.0
    assert used.running


def test_cgroup_v2_stats_and_no_memory_limit() -> None:
    used = from_stats(V2, now=1.0)
    assert used.cpu_percent == 50.0  # 0.5 s over 4 s of system time on 4 CPUs
    assert used.memory_bytes == 9_000_000
    assert used.memory_limit_bytes == 0  # the cgroup's "unlimited"
    assert used.pids == 7


def test_first_sample_of_a_new_container_has_no_percentage() -> None:
    fresh = {**V1, "precpu_stats": {"cpu_usage": {"total_usage": 0}}}
    assert from_stats(fresh).cpu_percent == 0.0
    assert from_stats({}).memory_bytes == 0  # a stopped container's empty answer


def test_workspace_bytes_counts_blocks_once_per_inode(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "blob").write_bytes(os.urandom(300_000))
    os.link(tmp_path / "a" / "blob", tmp_path / "again")
    os.symlink("/etc", tmp_path / "etc")  # not followed
    (tmp_path / "sparse").write_bytes(b"")
    os.truncate(tmp_path / "sparse", 1 << 30)  # a gigabyte, no block written
    total = workspace_bytes(str(tmp_path))
    assert 300_000 <= total < 300_000 + 64 * 1024


def test_workspace_walk_is_bounded(tmp_path: Path, monkeypatch: Any) -> None:
    for i in range(50):
        (tmp_path / f"f{i}").write_bytes(b"x" * 5000)
    monkeypatch.setattr(tree_size, "MAX_ENTRIES", 10)
    assert workspace_bytes(str(tmp_path)) <= 10 * 8192  # stopped after ten entries: a floor
