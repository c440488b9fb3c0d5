"""Snapshots and forks on the real Docker backend are bounded while they copy: a tenant allowed
4 MiB of snapshots whose session holds more (in its workspace, or in its container's /tmp) gets
RESOURCE_EXHAUSTED saying where the copy stopped, nothing is left under ``<home>/snapshots``, and
the session goes on as it was: thawed if the copy froze it, still paused if it was paused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.wire.convert import SessionInfo
from tests.blocks import text_at
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.integration.helpers import containers_of
from tests.server.conftest import Harness, base_config, deep_merge

pytestmark = pytest.mark.docker


async def sh(client: AsyncDispatcherClient, sid: str, command: str) -> str:
    result = await client.call(sid, "shell", {"command": command})
    assert not result.is_error, text_at(result)
    return text_at(result)


def config(tmp_path: Path) -> dict[str, Any]:
    data = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    data["tenants"][0]["quotas"] = {"max_snapshot_bytes": "4m"}
    return data


def left_under_snapshots(harness: Harness) -> list[str]:
    """Everything under the tenant's snapshots directory, the copies' hidden ones too."""
    root = harness.tmp / "home" / "snapshots" / "alpha"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def paused_containers(harness: Harness, docker_client: docker.DockerClient) -> list[str]:
    instance = harness.server.provider.instance  # type: ignore[attr-defined]
    found = []
    for c in containers_of(docker_client, instance):
        c.reload()
        if c.attrs["State"]["Paused"]:
            found.append(c.name)
    return found


async def test_a_snapshot_past_the_budget_stops_and_the_session_goes_on(
    make_provider: ProviderFactory, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with docker_server(make_provider, tmp_path, config(tmp_path)) as harness:
        client = harness.client()
        sid = (await client.create_session("big")).session_id
        await sh(client, sid, "echo small > small.txt && head -c 8000000 /dev/zero > big.bin")

        # The workspace: 8 MB against 4 MiB.
        with pytest.raises(RequestFailed) as past:
            await client.snapshot_session(sid)
        details = past.value.details
        assert past.value.code == "RESOURCE_EXHAUSTED", details
        assert "stopped at workspace/big.bin" in details and "quotas.max_snapshot_bytes" in details
        assert "delete a snapshot or remove files from the workspace" in details
        assert left_under_snapshots(harness) == [] and await client.list_snapshots() == []
        assert not (await client.get_session(sid)).paused
        assert paused_containers(harness, docker_client) == []  # thawed after the refusal
        assert "8000000 big.bin" in await sh(client, sid, "wc -c big.bin")

        # The container's /tmp: the same budget, the workspace now small.
        await sh(client, sid, "rm big.bin && head -c 6000000 /dev/urandom > /tmp/cache.bin")
        with pytest.raises(RequestFailed) as past_tmp:
            await client.snapshot_session(sid)
        assert past_tmp.value.code == "RESOURCE_EXHAUSTED"
        assert "stopped at tmp/cache.bin" in past_tmp.value.details
        assert left_under_snapshots(harness) == []

        # A paused session is refused the same way and stays paused.
        await client.pause_session(sid)
        with pytest.raises(RequestFailed) as past_paused:
            await client.snapshot_session(sid)
        assert past_paused.value.code == "RESOURCE_EXHAUSTED"
        assert (await client.get_session(sid)).paused and len(paused_containers(harness, docker_client)) == 1
        await client.resume_session(sid)
        assert "6000000 /tmp/cache.bin" in await sh(client, sid, "wc -c /tmp/cache.bin")

        # Within the bound again: taken whole, its size as du measures it.
        await sh(client, sid, "rm /tmp/cache.bin && head -c 1000000 /dev/urandom > mid.bin")
        snap = await client.snapshot_session(sid)
        assert 1_000_000 <= snap.size_bytes < 4 << 20
        assert left_under_snapshots(harness)[0] == snap.snapshot_id


async def test_a_fork_past_the_budget_makes_no_child_and_leaves_no_copy(
    make_provider: ProviderFactory, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    async with docker_server(make_provider, tmp_path, config(tmp_path)) as harness:
        client = harness.client()
        sid = (await client.create_session("big")).session_id
        await sh(client, sid, "head -c 3000000 /dev/zero > a.bin && head -c 3000000 /dev/zero > /tmp/b.bin")
        with pytest.raises(RequestFailed) as past:
            await client.fork_session(sid, 2)
        details = past.value.details
        assert past.value.code == "RESOURCE_EXHAUSTED" and "the fork's copy stopped at" in details
        assert [s.session_id for s in await client.list_sessions()] == [sid]
        assert left_under_snapshots(harness) == []  # no .fork-* copy left
        assert paused_containers(harness, docker_client) == []
        assert "3000000" in await sh(client, sid, "wc -c < /tmp/b.bin")

        # Within it: the child has the files, and the fork's copy is gone after.
        await sh(client, sid, "rm /tmp/b.bin")
        (child,) = await client.fork_session(sid, 1)
        assert isinstance(child, SessionInfo), child
        assert "3000000" in await sh(client, child.session_id, "wc -c < a.bin")
        assert left_under_snapshots(harness) == []
