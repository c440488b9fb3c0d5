"""A snapshot's or a fork's copy is bounded while it copies, through the real server: past what the
tenant's ``max_snapshot_bytes`` leaves (or ``max_snapshot_entries``) it stops, nothing is left
under ``<home>/snapshots``, and the RPC is RESOURCE_EXHAUSTED saying how far it got and what to
do. The local backend copies no sandbox, so a subclass stands in for Docker's part of ``capture``:
a host directory as the sandbox's /tmp, copied as Docker's is (``tree_copy`` against the same
budget, then the server's own workspace copy); the Docker run is
``tests/integration/grpc/test_snapshot_budget_docker.py``."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.client import RequestFailed
from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.core.provider_api import CopyBudget, ProviderHooks
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.local import LocalSandboxProvider
from dispatcher.sandbox.tree_copy import MAX_DEPTH, copy_tree, run_copy
from dispatcher.server.app import build_server
from dispatcher.wire.convert import SessionInfo
from tests.blocks import text_at
from tests.server.conftest import Harness, base_config, deep_merge

MiB = 1 << 20


class CopyingProvider(LocalSandboxProvider):
    """The local backend with a host directory standing in for each sandbox's /tmp."""

    def __init__(self, tmp: Path, hooks: ProviderHooks) -> None:
        super().__init__(hooks=hooks)
        self.tmp = tmp
        self.seeding = asyncio.Event()
        """Set when a child of a fork is being started from the fork's copy."""
        self.release = asyncio.Event()
        """Set by the test: the children's starts go on."""

    async def capture(
        self,
        session: Session,
        tmp_dest: str,
        copy_workspace: Callable[[], Awaitable[None]],
        budget: CopyBudget,
    ) -> bool:
        await asyncio.to_thread(os.makedirs, tmp_dest, 0o700)
        await run_copy(budget, functools.partial(copy_tree, str(self.tmp), tmp_dest, budget, label="tmp"))
        await copy_workspace()
        return True

    async def seed_tmp(self, session: Session, source: str) -> None:
        self.seeding.set()
        await self.release.wait()


Start = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    harnesses: list[Harness] = []
    (tmp_path / "sandbox-tmp").mkdir()

    async def run(quotas: dict[str, Any]) -> Harness:
        data = base_config(tmp_path)
        data["tenants"][0] = deep_merge(data["tenants"][0], {"quotas": quotas})
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        config, _ = ensure_default_tenant(load_config(path, env={}))
        server = build_server(config, provider=lambda hooks: CopyingProvider(tmp_path / "sandbox-tmp", hooks))
        await server.start()
        harness = Harness(server, tmp_path)
        harnesses.append(harness)
        return harness

    yield run
    for h in harnesses:
        for c in h.clients:
            await c.close()
        await h.server.stop(grace=1)


def snapshots_dir(harness: Harness) -> Path:
    return harness.tmp / "home" / "snapshots" / "alpha"


async def test_a_workspace_past_the_budget_stops_the_copy_and_leaves_nothing(start: Start) -> None:
    harness = await start({"max_snapshot_bytes": "4m"})
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    ws = harness.tmp / "ws-alpha" / "w"
    (ws / "small.txt").write_text("kept\n")
    (ws / "big.bin").write_bytes(b"\0" * (6 * MiB))
    with pytest.raises(RequestFailed) as past:
        await client.snapshot_session(sid)
    details = past.value.details
    assert past.value.code == "RESOURCE_EXHAUSTED", details
    assert "stopped at workspace/big.bin" in details and "quotas.max_snapshot_bytes (4,194,304)" in details
    assert "delete a snapshot or remove files from the workspace" in details
    assert await client.list_snapshots() == [] and not list(snapshots_dir(harness).iterdir())

    # Within the bound: taken, its size recorded as du measures it; the next one counts it.
    (ws / "big.bin").write_bytes(b"\1" * (3 * MiB))
    first = await client.snapshot_session(sid)
    assert 3 * MiB <= first.size_bytes < 4 * MiB
    with pytest.raises(RequestFailed) as second:
        await client.snapshot_session(sid)
    assert second.value.code == "RESOURCE_EXHAUSTED"
    assert f"already hold {first.size_bytes:,} bytes" in second.value.details
    assert sorted(p.name for p in snapshots_dir(harness).iterdir()) == [first.snapshot_id]
    assert "kept" in text_at(await client.call(sid, "read_file", {"path": "small.txt"}))


async def test_tmp_and_workspace_share_one_budget(start: Start) -> None:
    harness = await start({"max_snapshot_bytes": "4m"})
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    (harness.tmp / "sandbox-tmp" / "cache").write_bytes(b"c" * (3 * MiB))
    (harness.tmp / "ws-alpha" / "w" / "data").write_bytes(b"d" * (2 * MiB))
    with pytest.raises(RequestFailed) as past:
        await client.snapshot_session(sid)
    assert past.value.code == "RESOURCE_EXHAUSTED" and "stopped at workspace/data" in past.value.details
    assert not list(snapshots_dir(harness).iterdir())


async def test_entries_are_bounded_per_snapshot(start: Start) -> None:
    harness = await start({"max_snapshot_entries": 50})
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    for i in range(80):
        (harness.tmp / "ws-alpha" / "w" / f"f{i}").write_text("")
    with pytest.raises(RequestFailed) as past:
        await client.snapshot_session(sid)
    assert past.value.code == "RESOURCE_EXHAUSTED"
    assert "quotas.max_snapshot_entries (50)" in past.value.details and "in 50 entries" in past.value.details
    assert not list(snapshots_dir(harness).iterdir())


async def test_a_fork_past_the_budget_makes_no_child_and_leaves_no_copy(start: Start) -> None:
    harness = await start({"max_snapshot_bytes": "4m"})
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    (harness.tmp / "ws-alpha" / "w" / "big.bin").write_bytes(b"\0" * (5 * MiB))
    with pytest.raises(RequestFailed) as past:
        await client.fork_session(sid, 3)
    details = past.value.details
    assert (
        past.value.code == "RESOURCE_EXHAUSTED" and "the fork's copy stopped at workspace/big.bin" in details
    )
    assert [s.session_id for s in await client.list_sessions()] == [sid]
    assert not list(snapshots_dir(harness).iterdir())  # no .fork-* copy left


async def test_a_forks_copy_counts_against_the_bound_while_it_lasts(start: Start) -> None:
    harness = await start({"max_snapshot_bytes": "4m"})
    provider = harness.server.provider
    assert isinstance(provider, CopyingProvider)
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    (harness.tmp / "ws-alpha" / "w" / "data").write_bytes(b"d" * (3 * MiB))
    forking = asyncio.ensure_future(client.fork_session(sid, 1))
    await asyncio.wait_for(provider.seeding.wait(), 30)  # the copy is made, its child starting
    (held,) = snapshots_dir(harness).iterdir()
    assert held.name.startswith(".fork-")
    with pytest.raises(RequestFailed) as past:
        await client.snapshot_session(sid)  # 3 MiB more would pass 4 MiB with the fork's 3
    assert (
        past.value.code == "RESOURCE_EXHAUSTED" and "forks under way) already hold 3," in past.value.details
    )
    provider.release.set()
    (child,) = await forking
    assert isinstance(child, SessionInfo), child
    assert not list(snapshots_dir(harness).iterdir())  # the fork's copy removed
    snap = await client.snapshot_session(sid)  # and no longer counted
    assert snap.size_bytes >= 3 * MiB


async def test_a_tree_nested_too_deep_is_refused_saying_where(start: Start) -> None:
    harness = await start({})
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    deep = harness.tmp / "ws-alpha" / "w" / "deep"
    deep.joinpath(*["d"] * (MAX_DEPTH + 5)).mkdir(parents=True)
    with pytest.raises(RequestFailed) as refused:
        await client.snapshot_session(sid)
    assert refused.value.code == "FAILED_PRECONDITION", refused.value.details
    assert f"nested deeper than {MAX_DEPTH} levels" in refused.value.details
    assert "workspace/deep/d/d/" in refused.value.details
    assert not list(snapshots_dir(harness).iterdir())
