"""The warm pool against the real daemon (marker ``docker``): a pooled container serves exactly one
session and sees exactly its workspace; the pool refills and is drained at shutdown."""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from dispatcher.sandbox.container.config import SandboxConfig, WarmPoolConfig
from dispatcher.sandbox.container.labels import LABEL_POOL
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from tests.integration.conftest import DEFAULT_TENANT, ProviderFactory
from tests.integration.helpers import containers_of, run
from tests.polling import until

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(os.geteuid() != 0, reason="the warm pool mounts workspaces: root only"),
]


async def _filled(provider: DockerSandboxProvider, n: int, timeout: float = 60.0) -> None:
    await until(lambda: provider.pool.ready >= n, f"the pool to fill to {n}", timeout=timeout, interval=0.05)


def _pooled(make_provider: ProviderFactory, size: int, instance: str | None = None) -> DockerSandboxProvider:
    """A provider with a pool; given ``instance`` (a restarted server's), its start-up sweep starts
    the pool, as a server's does, after deciding what is kept."""
    config = SandboxConfig(warm_pool=WarmPoolConfig(size=size), workspace_quota=None)
    provider = make_provider(config, instance=instance)
    provider.pool.expect_tenants({DEFAULT_TENANT: (None, None)})
    if instance is None:
        provider.pool.start()
    return provider


async def test_a_pooled_container_serves_one_session_and_sees_exactly_its_workspace(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = _pooled(make_provider, 2)
    await _filled(provider, 2)
    waiting = {c.id for c in containers_of(docker_client, provider.instance) if c.labels.get(LABEL_POOL)}
    mine, other = make_provider.session("mine"), make_provider.session("other")
    Path(mine.workspace_path, "mine.txt").write_text("mine\n")
    Path(other.workspace_path, "other.txt").write_text("other\n")
    sandbox = provider.sandbox_for(mine)

    ran = await run(
        sandbox, "ls -A /workspace; cat /workspace/mine.txt; echo new > /workspace/new.txt; id -u"
    )

    assert ran.result.exit_code == 0, ran.err
    assert ran.out.split() == ["mine.txt", "mine", "1000"]  # no marker, nothing of another session
    assert Path(mine.workspace_path, "new.txt").read_text() == "new\n"
    assert sandbox.container_id in waiting and provider.pool.hits == 1
    used = sandbox.container_id
    assert used is not None
    # The pool refills to its size; the adopted container is no longer among the waiting.
    await _filled(provider, 2)
    second = provider.sandbox_for(other)
    ran = await run(second, "ls -A /workspace")
    assert ran.out.split() == ["other.txt"]
    assert second.container_id != used

    await provider.close_session(mine.session_id)
    assert used not in {c.id for c in containers_of(docker_client, provider.instance)}
    assert not provider.pool.owns(used)  # never handed back to the pool


async def test_the_pool_is_drained_at_shutdown(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = _pooled(make_provider, 2)
    await _filled(provider, 2)
    session = make_provider.session()
    await run(provider.sandbox_for(session), "true")
    assert provider.pool.hits == 1

    await provider.aclose()

    assert containers_of(docker_client, provider.instance) == []
    assert not [m for m in Path("/proc/mounts").read_text().splitlines() if provider.pool._slots_dir in m]


async def test_a_restarted_server_readopts_a_pooled_sessions_container(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    first = _pooled(make_provider, 1)
    await _filled(first, 1)
    session = make_provider.session()
    Path(session.workspace_path, "mine.txt").write_text("mine\n")
    sandbox = first.sandbox_for(session)
    ran = await run(sandbox, "echo kept > /tmp/kept; (sleep 1000 &) ; true")
    assert ran.result.exit_code == 0, ran.err
    container = sandbox.container_id
    assert first.pool.hits == 1 and container is not None
    await first.detach_all()  # a stop that keeps the sessions: the agent exits, the container stays
    await first.aclose()  # the waiting containers go; the adopted one is the session's

    second = _pooled(make_provider, 1, instance=first.instance)
    second.expect_container(session, container)
    await second.remove_orphans()
    again = second.sandbox_for(session)
    ran = await run(again, "cat /tmp/kept; ls -A /workspace")

    assert again.container_id == container  # the same container: /tmp and the workspace as they were
    assert ran.out.split() == ["kept", "mine.txt"], ran.err
    [slot] = [
        m["Source"]
        for m in docker_client.api.inspect_container(container)["Mounts"]
        if m["Destination"] == "/workspace"
    ]
    assert slot in Path("/proc/mounts").read_text()  # the restart kept it mounted
    await second.close_session(session.session_id)
    assert container not in {c.id for c in containers_of(docker_client, second.instance)}
    assert slot not in Path("/proc/mounts").read_text() and not os.path.exists(slot)  # gone with it
