"""Re-adopting a session's container in a new provider (a restarted server), below the gRPC layer."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import docker
import pytest

from dispatcher.core.capabilities import Capabilities
from dispatcher.core.sandbox_api import collect_notices
from dispatcher.sandbox.container.config import SandboxConfig
from tests.integration.conftest import SANDBOX_IDS, ProviderFactory
from tests.integration.helpers import run, runsc_available
from tests.polling import until

pytestmark = pytest.mark.docker

BACKGROUND = "sleep 1000 >/dev/null 2>&1 &"
KILL_SLEEP = (
    "for p in /proc/[0-9]*; do"
    " [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = 'sleep 1000 ' ] && kill ${p#/proc/}; done; true"
)


@pytest.mark.parametrize("runtime", [None, "runsc"])
async def test_a_readopted_sandbox_counts_the_old_agents_background_work(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, runtime: str | None
) -> None:
    if runtime == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    first = make_provider(SandboxConfig(runtime=runtime))
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, BACKGROUND + " echo kept > /tmp/kept")).result.exit_code == 0
    container = sandbox.container_id
    assert container is not None
    await first.detach_all()  # a graceful stop that keeps the session: its agent exits, sleep stays
    await first.pool.aclose()  # as the stop does: a warm pool's waiting containers go

    second = make_provider(SandboxConfig(runtime=runtime), instance=first.instance)
    second.expect_container(session, container)
    assert await second.remove_orphans() == 0
    await second.adopt_all()
    again = second.sandbox_for(session)
    assert again.container_id == container and again.adopting is None
    assert (await run(again, "cat /tmp/kept")).out == "kept\n"  # the same container, its /tmp kept
    # The idle reaper spares a sandbox while something commands started still runs in it, even
    # when an earlier agent started it...
    assert not await again.retire_if_idle(time.monotonic() + 3600, ttl=1)
    killed = await run(again, KILL_SLEEP)
    assert killed.result.exit_code == 0
    # ... and removes it, as any other, once nothing runs (the killed process may take a moment).
    await until(
        lambda: again.retire_if_idle(time.monotonic() + 3600, ttl=1),
        "the idle sandbox's removal",
        interval=0.05,
    )
    assert again.container_id is None


async def test_an_expected_container_with_other_labels_is_removed_not_adopted(
    make_provider: ProviderFactory,
) -> None:
    first = make_provider()
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, "echo hi > /tmp/x")).result.exit_code == 0
    container = sandbox.container_id
    assert container is not None
    await first.detach_all()
    await first.pool.aclose()

    other = make_provider.session("other")  # a different session claims that container
    second = make_provider(SandboxConfig(), instance=first.instance)
    second.expect_container(other, container)
    assert await second.remove_orphans() == 1
    with collect_notices() as notices:
        result = await run(second.sandbox_for(other), "ls /tmp/x")
    assert result.result.exit_code != 0
    assert any("recreated" in n and "labels no longer matched" in n for n in notices)


async def test_a_container_whose_id_was_never_stored_is_readopted_by_its_labels(
    make_provider: ProviderFactory,
) -> None:
    first = make_provider()
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, "echo kept > /tmp/kept")).result.exit_code == 0
    container = sandbox.container_id
    await first.detach_all()  # then the server dies before its state names the container
    await first.pool.aclose()

    second = make_provider(SandboxConfig(), instance=first.instance)
    second.sandbox_for(session).expect_labelled()  # given back with no stored container
    assert await second.remove_orphans() == 0
    again = second.sandbox_for(session)
    ran = await run(again, "cat /tmp/kept")
    assert again.container_id == container and ran.out == "kept\n"


@pytest.mark.parametrize("runtime", [None, "runsc"])
async def test_a_readopted_container_whose_workspace_was_replaced_is_recreated(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, runtime: str | None
) -> None:
    if runtime == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    first = make_provider(SandboxConfig(runtime=runtime))
    made = make_provider.session()
    workspace = Path(made.workspace_path)
    # With grants, so launched for it rather than taken from the warm pool; reached by walking
    # from the tenant's root, as the server reaches it.
    session = dataclasses.replace(
        made,
        capabilities=Capabilities.of(fs=[(".", "rw")]),
        workspace_root=str(workspace.parent),
        workspace_name=workspace.name,
    )
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, "echo old > /workspace/f")).result.exit_code == 0
    container = sandbox.container_id
    assert container is not None
    await first.detach_all()
    await first.pool.aclose()

    # While no server runs, the directory is renamed and another put at its path.
    moved = workspace.with_name(workspace.name + "-moved")
    workspace.rename(moved)
    workspace.mkdir()
    os.chown(workspace, SANDBOX_IDS[0], SANDBOX_IDS[1])

    second = make_provider(SandboxConfig(runtime=runtime), instance=first.instance)
    second.expect_container(session, container)
    assert await second.remove_orphans() == 0  # kept by its labels, then checked as it is re-adopted
    again = second.sandbox_for(session)
    with collect_notices() as notices:
        ran = await run(again, "echo new > /workspace/g")
    assert ran.result.exit_code == 0
    assert again.container_id != container
    assert any("recreated" in n and "no longer saw the session's workspace" in n for n in notices), notices
    assert sorted(p.name for p in workspace.iterdir()) == ["g"] and (workspace / "g").read_text() == "new\n"
    assert sorted(p.name for p in moved.iterdir()) == ["f"]  # the renamed one is untouched
