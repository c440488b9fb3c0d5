"""Container lifecycle: lazy creation, labels, close, idle expiry, orphans, fallback, gVisor."""

from __future__ import annotations

import asyncio
import os
import time

import docker
import pytest

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.file_guard import AgentUnavailable
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_SESSION, LABEL_TENANT
from tests.integration.conftest import BUSYBOX_IMAGE, ProviderFactory
from tests.integration.helpers import containers_of, run, runsc_available
from tests.polling import until

pytestmark = pytest.mark.docker

ROOT_MOUNT_OPTIONS = "awk '$2 == \"/\" { print $4 }' /proc/mounts"


async def test_container_is_lazy_labelled_hardened_and_removed_on_close(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider()
    session = make_provider.session(tenant="tenant-x")
    sandbox = provider.sandbox_for(session)
    assert containers_of(docker_client, provider.instance) == []  # nothing before the first call
    await run(sandbox, "true")
    [container] = containers_of(docker_client, provider.instance)
    assert container.labels[LABEL_SESSION] == session.session_id
    assert container.labels[LABEL_TENANT] == "tenant-x"
    assert container.labels[LABEL_INSTANCE] == provider.instance
    host = container.attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"]
    assert "no-new-privileges:true" in host["SecurityOpt"] and host["Init"] is True
    assert host["PidsLimit"] == 256 and host["Memory"] == 512 << 20
    assert container.attrs["Config"]["User"] == "1000:1000"
    await provider.close_session(session.session_id)
    assert containers_of(docker_client, provider.instance) == []


async def test_idle_container_is_removed_and_recreated(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider(SandboxConfig(idle_ttl_seconds=0.3))
    sandbox = provider.sandbox_for(make_provider.session())
    await sandbox.write("kept.txt", "still here")
    first = sandbox.container_id
    await until(lambda: not containers_of(docker_client, provider.instance), timeout=10)
    assert sandbox.container_id is None
    assert await sandbox.read("kept.txt") == "still here"  # the workspace outlives the container
    assert sandbox.container_id not in (None, first)


async def test_busy_container_is_not_idle(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider(SandboxConfig(idle_ttl_seconds=0.2))
    sandbox = provider.sandbox_for(make_provider.session())
    ran = await run(sandbox, "sleep 1; echo done")
    assert ran.out == "done\n" and not ran.result.killed


async def test_orphans_of_a_crashed_server_are_removed_by_the_next_one(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    instance = make_provider.new_instance()
    crashed = make_provider(instance=instance)
    neighbour = make_provider()  # another server on the same host
    kept, lost = make_provider.session("kept"), make_provider.session("lost")
    for session in (kept, lost):
        await run(crashed.sandbox_for(session), "true")
    await run(neighbour.sandbox_for(make_provider.session()), "true")
    # The crash: the provider's connections go away, its containers stay.
    for sandbox in crashed._sandboxes.values():
        assert sandbox._live is not None and sandbox._live.channel is not None
        await sandbox._live.channel.close()
    await crashed.api.aclose()
    make_provider.providers.remove(crashed)
    assert len(containers_of(docker_client, instance)) == 2

    restarted = make_provider(instance=instance)
    removed = await restarted.remove_orphans(live_session_ids=[kept.session_id])
    assert removed == 1
    [survivor] = containers_of(docker_client, instance)
    assert survivor.labels[LABEL_SESSION] == kept.session_id
    assert await restarted.remove_orphans() == 1
    assert containers_of(docker_client, instance) == []
    # The agents' listener directories went with their containers.
    assert os.listdir(restarted.launcher.sockets.root) == []
    assert len(containers_of(docker_client, neighbour.instance)) == 1  # never touched


async def test_image_without_python_falls_back_to_docker_exec(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    try:
        docker_client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{BUSYBOX_IMAGE} not built (sandbox_images/build.sh busybox)")
    provider = make_provider(SandboxConfig(image=BUSYBOX_IMAGE, exec_fallback=True))
    sandbox = provider.sandbox_for(make_provider.session())
    ran = await run(sandbox, "echo out; echo err >&2; id -u; pwd; exit 4")
    assert ran.result.exit_code == 4
    assert ran.out == "out\n1000\n/workspace\n" and ran.err == "err\n"
    ran = await run(sandbox, "trap '' TERM; echo stubborn; sleep 30", timeout=0.5, grace=0.3)
    assert ran.result.timed_out and ran.out == "stubborn\n"
    with pytest.raises(AgentUnavailable):
        await sandbox.read("anything")


async def test_check_ready_names_a_missing_image(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(image="dispatcher-no-such-image:none"))
    with pytest.raises(SandboxError, match="make images"):
        await provider.check_ready()
    await make_provider().check_ready()


async def test_runsc_smoke(make_provider: ProviderFactory, docker_client: docker.DockerClient) -> None:
    if not runsc_available(docker_client):
        pytest.skip("runtime runsc is not registered with dockerd (run scripts/ensure-runsc.sh)")
    provider = make_provider(SandboxConfig(runtime="runsc", pids_limit=128))
    sandbox = provider.sandbox_for(make_provider.session())
    ran = await run(sandbox, "id -u; grep CapEff /proc/self/status; tail -n +3 /proc/net/dev | cut -d: -f1")
    uid, capeff, *interfaces = ran.out.split("\n")
    assert uid != "0" and int(capeff.split()[1], 16) == 0
    assert [i.strip() for i in interfaces if i.strip()] == ["lo"]
    assert (await run(sandbox, ROOT_MOUNT_OPTIONS)).out.startswith("ro,")
    await sandbox.write("g.txt", "gvisor")
    assert await sandbox.read("g.txt") == "gvisor"
    ran = await run(sandbox, "trap '' TERM; echo stubborn; sleep 30", timeout=0.5, grace=0.3)
    assert ran.result.killed and ran.out == "stubborn\n"
    [container] = containers_of(docker_client, provider.instance)
    assert container.attrs["HostConfig"]["Runtime"] == "runsc"


async def test_concurrent_sessions_get_separate_containers(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider()
    sandboxes = [provider.sandbox_for(make_provider.session(f"c{i}")) for i in range(3)]
    results = await asyncio.gather(*(run(s, "hostname; echo $$") for s in sandboxes))
    assert all(r.result.exit_code == 0 for r in results)
    assert len(containers_of(docker_client, provider.instance)) == 3
    await provider.aclose()
    assert containers_of(docker_client, provider.instance) == []


async def test_a_burst_of_new_sessions_all_start(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    # Many first calls at once used to start every agent together, so on two cores most of them
    # missed the start deadline; launches now take turns and each is quick.
    provider = make_provider(SandboxConfig(max_concurrent_launches=2, agent_start_timeout=20))
    sessions = [make_provider.session(f"burst{i}") for i in range(12)]
    outputs = await asyncio.gather(
        *(run(provider.sandbox_for(s), f"echo {i}") for i, s in enumerate(sessions))
    )
    assert [o.out.strip() for o in outputs] == [str(i) for i in range(12)]
    assert len(containers_of(docker_client, provider.instance)) == 12
    await asyncio.gather(*(provider.close_session(s.session_id) for s in sessions))
    assert containers_of(docker_client, provider.instance) == []


async def test_a_closed_session_is_never_relaunched(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider()
    session = make_provider.session()
    sandbox = provider.sandbox_for(session)
    await run(sandbox, "true")
    await provider.close_session(session.session_id)
    with pytest.raises(SandboxError, match="is closed"):
        await sandbox.write("late.txt", "a call that raced CloseSession")
    assert containers_of(docker_client, provider.instance) == []


async def test_a_container_past_its_lifetime_goes_with_what_ran_in_the_background(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider(SandboxConfig(max_lifetime_seconds=1.0))
    sandbox = provider.sandbox_for(make_provider.session())
    ran = await run(sandbox, "nohup sleep 1001 >/dev/null 2>&1 & echo started")
    assert ran.out == "started\n", ran.err
    first = sandbox.container_id
    # The reaper retires it although a process still runs (idleness alone would spare it).
    await until(
        lambda: first not in [c.id for c in containers_of(docker_client, provider.instance)], timeout=15
    )
    ran = await run(sandbox, "pgrep -cf 'sleep 100[1]' || true")  # [1]: not this shell's own line
    assert ran.out.strip() == "0" and sandbox.container_id not in (None, first)


@pytest.mark.parametrize("runtime", [None, "runsc"])
async def test_a_process_the_server_attached_is_not_work_but_a_command_left_running_is(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, runtime: str | None
) -> None:
    """A sandboxed MCP server waits for calls forever: it must not keep an unused container from
    its idle removal. What a command left running still does (a background build is work)."""
    if runtime == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    provider = make_provider(SandboxConfig(runtime=runtime))
    sandbox = provider.sandbox_for(make_provider.session())
    ran = await run(sandbox, "nohup sleep 1003 >/dev/null 2>&1 & echo started")
    assert ran.out == "started\n", ran.err
    later = time.monotonic() + 10_000
    assert not await sandbox.retire_if_idle(later, ttl=600)  # the command's process is work
    await run(sandbox, "pkill -f 'sleep 100[3]'; true")
    server = await sandbox.start_process("sleeper", ["sleep", "1004"], {}, limit=1 << 16)
    try:

        async def running() -> bool:  # it runs, as the session's MCP server would
            return (await run(sandbox, "pgrep -cf 'sleep 100[4]'")).out.strip() == "1"

        await until(running, "the attached process to run", interval=0.05)
        assert await sandbox.retire_if_idle(later, ttl=600)  # and it alone is not work
    finally:
        await server.close()
