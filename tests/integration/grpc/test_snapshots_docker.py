"""Snapshots and forks on the real Docker backend: the workspace and /tmp ($HOME inside it) copied
with the sandbox held still, sessions started from a snapshot see that state, children of a fork
are apart from each other and from the parent, the tenant's bounds and another tenant's view."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import docker
import pytest
import yaml

from dispatcher import cli
from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.config.load import Config, ensure_default_tenant, load_config
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.server.app import build_server
from dispatcher.wire.convert import SessionInfo
from dispatcher.wire.convert_snapshots import ForkFailure
from tests.blocks import text_at
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.integration.helpers import containers_of, runsc_available
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness, base_config, deep_merge

pytestmark = pytest.mark.docker

SETUP = (
    'mkdir -p "$HOME/venv" && echo home-state > "$HOME/venv/marker"'
    " && echo ws-state > proj.txt && head -c 3000000 /dev/urandom > blob && echo ok"
)
READ = 'cat proj.txt "$HOME/venv/marker" 2>&1; ls'


async def sh(client: AsyncDispatcherClient, sid: str, command: str) -> str:
    result = await client.call(sid, "shell", {"command": command})
    assert not result.is_error, text_at(result)
    return text_at(result)


async def test_snapshot_of_a_paused_session_and_sessions_from_it(
    make_provider: ProviderFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)
    data = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    data["tenants"][0]["quotas"] = {"max_snapshots": 2, "max_snapshot_bytes": "64m"}
    async with docker_server(make_provider, tmp_path, data) as harness:
        client = harness.client()
        sid = (await client.create_session("snap")).session_id
        assert "ok" in await sh(client, sid, SETUP)
        await client.pause_session(sid)
        snap = await client.snapshot_session(sid, "after setup")
        assert (await client.get_session(sid)).paused  # a paused session stays paused
        assert snap.size_bytes >= 3_000_000 and snap.tenant == "alpha" and snap.name == "after setup"
        assert [s.snapshot_id for s in await client.list_snapshots()] == [snap.snapshot_id]
        await client.resume_session(sid)
        await sh(client, sid, 'echo changed > proj.txt && rm "$HOME/venv/marker"')

        # Another tenant: cannot list, use or delete it.
        beta = harness.client(TOKEN_BETA)
        assert await beta.list_snapshots() == []
        for attempt in (
            beta.create_session(snapshot_id=snap.snapshot_id),
            beta.delete_snapshot(snap.snapshot_id),
            beta.fork_session(snapshot_id=snap.snapshot_id, count=1),
        ):
            with pytest.raises(RequestFailed) as refused:
                await attempt
            assert refused.value.code == "NOT_FOUND"

        child = await client.create_session(snapshot_id=snap.snapshot_id)
        seen = await sh(client, child.session_id, READ)
        assert "ws-state" in seen and "home-state" in seen and "blob" in seen
        with pytest.raises(RequestFailed) as used:  # the parent's workspace is not empty
            await client.create_session("snap", snapshot_id=snap.snapshot_id)
        assert used.value.code == "INVALID_ARGUMENT" and "not empty" in used.value.details
        (forked,) = await client.fork_session(snapshot_id=snap.snapshot_id, count=1)
        assert isinstance(forked, SessionInfo)
        seen = await sh(client, forked.session_id, READ)
        assert "ws-state" in seen and "home-state" in seen
        await client.close_session(forked.session_id)

        # The CLI lists it too.
        capsys.readouterr()
        argv = ["snapshots", "--json", "--server", harness.target]
        assert await asyncio.to_thread(cli.main, argv) == 0
        assert json.loads(capsys.readouterr().out)["snapshot_id"] == snap.snapshot_id
        assert "changed" in await sh(client, sid, "cat proj.txt")  # the parent as it is now

        # The tenant's bounds: a count of 2, then 64 MiB.
        second = await client.snapshot_session(sid)
        with pytest.raises(RequestFailed) as full:
            await client.snapshot_session(sid)
        assert full.value.code == "RESOURCE_EXHAUSTED" and "max_snapshots" in full.value.details
        assert await client.delete_snapshot(second.snapshot_id) == second.size_bytes
        await sh(client, sid, "head -c 70000000 /dev/zero > big")
        with pytest.raises(RequestFailed) as big:
            await client.snapshot_session(sid)
        assert big.value.code == "RESOURCE_EXHAUSTED" and "max_snapshot_bytes" in big.value.details

        root = Path(data["home"]) / "snapshots" / "alpha"
        assert sorted(p.name for p in root.iterdir()) == [snap.snapshot_id]  # nothing left of refusals
        freed = await client.delete_snapshot(snap.snapshot_id)
        assert freed == snap.size_bytes
        assert list(root.iterdir()) == []
        with pytest.raises(RequestFailed) as gone:
            await client.create_session(snapshot_id=snap.snapshot_id)
        assert gone.value.code == "NOT_FOUND"


async def test_fork_children_are_apart_and_past_the_quota_are_errors(
    make_provider: ProviderFactory, tmp_path: Path
) -> None:
    data = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    data["tenants"][0]["quotas"] = {"max_sessions": 4}
    async with docker_server(make_provider, tmp_path, data) as harness:
        client = harness.client()
        parent = await client.create_session("parent", mode="autonomous", labels={"k": "v"})
        sid = parent.session_id
        assert "ok" in await sh(client, sid, SETUP)
        results = await client.fork_session(sid, 4)
        kids = [r for r in results if isinstance(r, SessionInfo)]
        assert len(kids) == 3  # the parent holds the fourth session
        assert isinstance(results[3], ForkFailure) and results[3].code == "RESOURCE_EXHAUSTED"
        assert {k.approval_mode for k in kids} == {parent.approval_mode}
        assert all(dict(k.labels) == {"k": "v"} for k in kids)
        assert len({k.workspace for k in kids} | {parent.workspace}) == 4
        for k in kids:
            seen = await sh(client, k.session_id, READ)
            assert "ws-state" in seen and "home-state" in seen
        await sh(client, kids[0].session_id, 'echo kid0 > proj.txt && echo kid0 > "$HOME/venv/marker"')
        for other in (kids[1].session_id, kids[2].session_id, sid):
            seen = await sh(client, other, READ)
            assert "kid0" not in seen and "ws-state" in seen and "home-state" in seen
        for k in kids:
            await client.close_session(k.session_id)
        assert not list((Path(data["home"]) / "snapshots" / "alpha").iterdir())  # the fork's copy removed


async def test_fork_of_8_with_a_30mb_workspace_and_a_home_virtualenv(
    make_provider: ProviderFactory, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    data = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    async with docker_server(make_provider, tmp_path, data) as harness:
        client = harness.client()
        sid = (await client.create_session("rollouts")).session_id
        setup = (
            "head -c 30000000 /dev/urandom > data.bin && sha256sum data.bin > data.sum"
            ' && python3 -m venv "$HOME/venv" && "$HOME/venv/bin/python" -c "print(42)"'
        )
        assert "42" in await sh(client, sid, setup)
        results = await client.fork_session(sid, 8)
        kids = [r.session_id for r in results if isinstance(r, SessionInfo)]
        assert len(kids) == 8, results
        check = (
            'sha256sum -c data.sum && "$HOME/venv/bin/python" -c "print(42)" && cat note 2>/dev/null; true'
        )
        for k in kids:
            seen = await sh(client, k, check)
            assert "data.bin: OK" in seen and "42" in seen and "note" not in seen
        await sh(client, kids[3], 'echo from-kid3 > note && echo x >> "$HOME/venv/pyvenv.cfg"')
        for other in [*kids[:3], *kids[4:], sid]:
            seen = await sh(client, other, 'cat note 2>&1; tail -1 "$HOME/venv/pyvenv.cfg"')
            assert "from-kid3" not in seen and "No such file" in seen and seen.strip().splitlines()[-1] != "x"
        assert "data.bin: OK" in await sh(client, sid, "sha256sum -c data.sum")  # the parent unchanged
        provider = harness.server.provider
        instance = provider.instance  # type: ignore[attr-defined]
        for k in kids:
            await client.close_session(k)
        left = {c.labels.get("dispatcher.session") for c in containers_of(docker_client, instance)}
        assert left.isdisjoint(kids)  # all 8 closed: no container of theirs is left
        assert not list((Path(data["home"]) / "snapshots" / "alpha").iterdir())  # nor a copy


async def test_gvisor_sessions_are_refused_saying_why(
    make_provider: ProviderFactory, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    if not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    config = SandboxConfig(runtime="runsc")
    server = build_server(
        load_default_config(tmp_path), provider=lambda hooks: make_provider(config, hooks=hooks)
    )
    await server.start()
    harness = Harness(server, tmp_path)
    try:
        client = harness.client()
        sid = (await client.create_session("g")).session_id
        await sh(client, sid, "echo x > /tmp/x")
        for attempt in (client.snapshot_session(sid), client.fork_session(sid, 1)):
            with pytest.raises(RequestFailed) as refused:
                await attempt
            assert refused.value.code == "FAILED_PRECONDITION" and "gVisor" in refused.value.details
        assert [s.session_id for s in await client.list_sessions()] == [sid]
    finally:
        for c in harness.clients:
            await c.close()
        await server.stop(grace=1)


def load_default_config(tmp_path: Path) -> Config:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})))
    config, _ = ensure_default_tenant(load_config(path, env={}))
    return config


async def test_a_delete_waits_for_sessions_being_made_from_the_snapshot(
    make_provider: ProviderFactory, tmp_path: Path
) -> None:
    data = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    async with docker_server(make_provider, tmp_path, data) as harness:
        client = harness.client()
        sid = (await client.create_session("src")).session_id
        assert "ok" in await sh(client, sid, SETUP)
        snap = await client.snapshot_session(sid)
        # The fork is under way (its children made, being filled) when the delete arrives.
        forking = asyncio.ensure_future(client.fork_session(snapshot_id=snap.snapshot_id, count=2))

        async def children_made() -> bool:
            return len(await client.list_sessions()) == 3 or forking.done()

        await until(children_made, "the fork's children", timeout=60, interval=0.01)
        freed = await client.delete_snapshot(snap.snapshot_id)
        forked = await forking
        assert freed == snap.size_bytes
        for k in forked:
            assert isinstance(k, SessionInfo), forked
            seen = await sh(client, k.session_id, READ)
            assert "ws-state" in seen and "home-state" in seen
        assert not (Path(data["home"]) / "snapshots" / "alpha" / snap.snapshot_id).exists()
