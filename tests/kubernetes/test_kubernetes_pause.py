"""Pausing a session on the Kubernetes backend (against the stand-in): a Pod cannot be frozen, so
its agent stops every process the session's commands started and resuming continues exactly
those; one a command stopped itself stays stopped; a pause outlives a server restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.core.provider_api import CopyBudget, SnapshotUnsupported, UsageUnsupported
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from tests.integration.helpers import run
from tests.kubernetes.backend_fixtures import KubeProviders

pytestmark = pytest.mark.docker

START = (
    "sleep 1000 >/dev/null 2>&1 & sleep 1001 >/dev/null 2>&1 & p=$!;"
    ' until [ "$(tr "\\0" " " < /proc/$p/cmdline)" = "sleep 1001 " ]; do :; done; kill -STOP $p'
)  # the second stopped by the command itself, once it is sleep (not the shell before its exec)
STATES = (
    "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null);"
    ' case "$c" in "sleep 100"*) echo "${c% } $(cut -d" " -f3 $p/stat)";; esac; done | sort'
)


async def states(sandbox: ContainerSandbox) -> dict[str, str]:
    """The state letter of each background ``sleep``, as a new command (not stopped) reads it."""
    out = (await run(sandbox, STATES)).out
    return {line.rsplit(" ", 1)[0]: line.rsplit(" ", 1)[1] for line in out.splitlines()}


async def test_kubernetes_pause_stops_what_commands_started_and_resume_continues_it(
    kube_providers: KubeProviders,
) -> None:
    provider = kube_providers()
    session = kube_providers.session()
    sandbox = provider.sandbox_for(session)
    await run(sandbox, START)
    assert await states(sandbox) == {"sleep 1000": "S", "sleep 1001": "T"}
    await provider.pause(session.session_id)
    assert await states(sandbox) == {"sleep 1000": "T", "sleep 1001": "T"}
    await provider.resume(session.session_id)
    # Only what the pause stopped continues: the command's own stop is left as it was.
    assert await states(sandbox) == {"sleep 1000": "S", "sleep 1001": "T"}


async def test_kubernetes_paused_pod_stays_stopped_across_a_restart_until_resumed(
    kube_providers: KubeProviders,
) -> None:
    instance = kube_providers.new_instance()
    first = kube_providers(instance=instance)
    session = kube_providers.session()
    sandbox = first.sandbox_for(session)
    await run(sandbox, "sleep 1000 >/dev/null 2>&1 &")
    await first.pause(session.session_id)
    pod = sandbox.container_id
    assert pod is not None
    await first.detach_all()

    second = kube_providers(instance=instance)
    again = second.sandbox_for(session)
    again.paused = True  # as a restored paused session's sandbox is (session_restored)
    second.expect_container(session, pod)
    await second.remove_orphans()
    await second.adopt_all()  # a paused session's Pod is not re-attached yet
    await again.adopt()  # re-attached while still paused: its processes stay stopped
    assert again.container_id == pod
    assert await states(again) == {"sleep 1000": "T"}
    await second.resume(session.session_id)
    assert await states(again) == {"sleep 1000": "S"}


async def test_kubernetes_usage_is_refused_saying_what_it_needs(kube_providers: KubeProviders) -> None:
    provider = kube_providers()
    session = kube_providers.session()
    await run(provider.sandbox_for(session), "true")  # a running Pod: still no figures for it
    with pytest.raises(UsageUnsupported, match=r"metrics API \(metrics\.k8s\.io"):
        await provider.usage(session)


async def test_kubernetes_snapshots_and_forks_are_refused_saying_what_they_need(
    kube_providers: KubeProviders, tmp_path: Path
) -> None:
    provider = kube_providers()
    session = kube_providers.session()
    copied: list[bool] = []

    async def copy_workspace() -> None:
        copied.append(True)

    with pytest.raises(SnapshotUnsupported, match="VolumeSnapshot"):
        await provider.capture(session, str(tmp_path / "tmp"), copy_workspace, CopyBudget(1 << 20, 100))
    with pytest.raises(SnapshotUnsupported, match="VolumeSnapshot"):
        await provider.seed_tmp(session, str(tmp_path))
    assert copied == []  # nothing half done
