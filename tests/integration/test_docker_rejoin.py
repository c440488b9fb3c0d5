"""A restarted server rejoins the agent waiting in a re-adopted runc container, against the real
daemon: the same agent process answers, no ``docker exec`` is made, and a process of the sandbox
that takes the agent's place at its name is neither given the channel nor served instead."""

from __future__ import annotations

import docker
import pytest

from dispatcher.sandbox.agent.protocol import waiting_socket_name
from dispatcher.sandbox.container.config import WORKSPACE_ROOT, SandboxConfig, WarmPoolConfig
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from dispatcher.sandbox.docker.agent.rejoin import RejoinedStream
from dispatcher.sandbox.docker.stream import SocketStream
from tests.integration.conftest import SANDBOX_IDS, ProviderFactory
from tests.integration.helpers import run
from tests.integration.test_docker_exec import FIND_AGENT, agent_signal

pytestmark = pytest.mark.docker

IMPOSTOR = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1].encode("latin-1").decode("unicode_escape"))
s.listen(8)
print("listening", flush=True)
while True:
    conn, _ = s.accept()
    conn.settimeout(3)
    try:
        _, fds, _, _ = socket.recv_fds(conn, 65536, 4)
    except OSError:
        fds = []
    with open("/tmp/impostor.log", "a") as log:
        log.write(f"connection fds={len(fds)}\\n")
    conn.close()
"""
"""Takes the agent's name once the agent is gone, and writes down every connection and whether
it was handed descriptors (a channel)."""


def _agents(client: docker.DockerClient, container_id: str) -> list[str]:
    code, out = client.containers.get(container_id).exec_run(["sh", "-c", FIND_AGENT])
    assert code == 0, out
    return [str(pid) for pid in out.decode().split()]


async def _restarted(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, before: str | None = None
) -> tuple[ContainerSandbox, str, list[str]]:
    """A session with a container, the server gone (``before`` then runs in the container as the
    sandbox user), a new provider that re-adopted it; (its sandbox, the container, the exec ids
    that ran before the restart)."""
    first = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)))
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, "sleep 1000 >/dev/null 2>&1 & echo started")).out == "started\n"
    container = sandbox.container_id
    assert container is not None
    await first.detach_all()
    if before is not None:
        code, out = docker_client.containers.get(container).exec_run(
            ["sh", "-c", before], user=f"{SANDBOX_IDS[0]}:{SANDBOX_IDS[1]}"
        )
        assert code == 0, out
    execs = list(docker_client.api.inspect_container(container)["ExecIDs"] or [])
    second = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)), instance=first.instance)
    second.expect_container(session, container)
    assert await second.remove_orphans() == 0
    await second.adopt_all()
    again = second.sandbox_for(session)
    assert isinstance(again, ContainerSandbox) and again.container_id == container
    return again, container, execs


async def test_a_restarted_server_rejoins_the_waiting_agent_without_an_exec(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    first = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)))
    probe = first.sandbox_for(make_provider.session())
    assert (await run(probe, "true")).result.exit_code == 0
    assert probe.container_id is not None
    (agent_before,) = _agents(docker_client, probe.container_id)
    await first.close_session(probe.session.session_id)

    again, container, execs = await _restarted(make_provider, docker_client)
    assert again._live is not None and isinstance(again._live.stream, RejoinedStream)
    (agent,) = _agents(docker_client, container)  # one agent, the one that served before
    ran = await run(again, "echo same; ps -eo args")
    assert ran.out.startswith("same\n") and ran.out.count("\nsleep 1000\n") == 1, ran.out  # still running
    assert _agents(docker_client, container) == [agent]
    # No exec was started for the re-adoption (the daemon lists the running ones: the first
    # agent's, still standing for it).
    assert list(docker_client.api.inspect_container(container)["ExecIDs"] or []) == execs
    assert agent_before  # a fresh container has its own agent too (the probe's)


async def test_an_impostor_at_the_agents_name_gets_no_channel(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    """A sandbox process (the agent's own user) kills the waiting agent and takes its name: the
    server connects, sees that the peer is not the agent, and starts a new one, which refuses to
    hand the impostor its channel too."""
    name = waiting_socket_name(SANDBOX_IDS[0], WORKSPACE_ROOT).encode("unicode_escape").decode("latin-1")
    take_over = (
        f"kill -KILL $({FIND_AGENT}); sleep 0.2;"
        f" python3 -c '{IMPOSTOR}' '{name}' > /tmp/impostor.out 2>&1 &"
        " for i in $(seq 50); do grep -q listening /tmp/impostor.out && exit 0; sleep 0.1; done; exit 1"
    )
    again, container, _ = await _restarted(make_provider, docker_client, before=take_over)
    assert again._live is not None and isinstance(again._live.stream, SocketStream)  # a new agent
    assert (await run(again, "echo served")).out == "served\n"
    code, log = docker_client.containers.get(container).exec_run(["cat", "/tmp/impostor.log"])
    assert code == 0, log
    lines = log.decode().splitlines()
    assert lines and all(line == "connection fds=0" for line in lines), lines  # asked, never handed


async def test_without_a_waiting_agent_a_new_one_is_started(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    again, container, _ = await _restarted(make_provider, docker_client, before=f"kill -KILL $({FIND_AGENT})")
    assert again._live is not None and isinstance(again._live.stream, SocketStream)
    assert (await run(again, "echo served")).out == "served\n"
    assert len(_agents(docker_client, container)) == 1
    agent_signal(docker_client, container, "0")  # alive


async def test_a_session_paused_across_the_restart_is_rejoined_once_resumed(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    """A frozen agent cannot take a channel: the container is left alone until the session is
    resumed, then the waiting agent, thawed, is rejoined like any other."""
    first = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)))
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, "echo before > /tmp/kept")).result.exit_code == 0
    container = sandbox.container_id
    assert container is not None
    (agent,) = _agents(docker_client, container)
    await sandbox.pause()
    await first.detach_all()

    second = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)), instance=first.instance)
    second.expect_container(session, container)
    again = second.sandbox_for(session)
    assert isinstance(again, ContainerSandbox)
    again.paused = True  # as ``session_restored`` marks a session stored as paused
    assert await second.remove_orphans() == 0
    await second.adopt_all()
    assert again.adopting == container  # left frozen, not re-attached
    assert docker_client.api.inspect_container(container)["State"]["Paused"]
    await again.resume(None)
    assert (await run(again, "cat /tmp/kept")).out == "before\n"
    assert again._live is not None and isinstance(again._live.stream, RejoinedStream)
    assert _agents(docker_client, container) == [agent]
