"""The agent's socket on runc, against the real daemon: a new container's agent speaks on it, the
socket is gone once it did, a process in the container that connects first is turned away, and an
agent that cannot connect is attached through the daemon instead."""

from __future__ import annotations

import asyncio
import os

import docker
import pytest

from dispatcher.sandbox.container.config import SandboxConfig, WarmPoolConfig
from dispatcher.sandbox.container.labels import LABEL_SPEC
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from dispatcher.sandbox.docker.agent.listener import SOCKET_DIR, AgentListener
from dispatcher.sandbox.docker.launch import ContainerLauncher
from dispatcher.sandbox.docker.stream import AttachStream, SocketStream
from tests.integration.conftest import DEFAULT_TENANT, ProviderFactory
from tests.integration.helpers import run
from tests.integration.test_docker_exec import agent_signal
from tests.polling import until

pytestmark = pytest.mark.docker

LURKER = (
    "import socket, time\n"
    "while True:\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n"
    f"        s.connect('{SOCKET_DIR}/agent.sock')\n"
    "        s.recv(1)\n"
    "    except OSError:\n"
    "        time.sleep(0.001)\n"
    "    s.close()\n"
)
"""Left running in the background: connects whenever a socket is there, as fast as it can."""
STRANGER = (
    "import socket, time\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    f"s.connect('{SOCKET_DIR}/agent.sock')\n"
    "print('connected', flush=True)\n"
    "print('closed' if s.recv(1) == b'' else 'data', flush=True)\n"
)


async def test_a_new_containers_agent_speaks_on_its_socket_and_leaves_nothing(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)))  # its own launch
    sandbox = provider.sandbox_for(make_provider.session())
    assert isinstance(sandbox, ContainerSandbox)
    ran = await run(sandbox, f"ls -A {SOCKET_DIR}; test -e {SOCKET_DIR}/agent.sock; echo $?")
    assert ran.result.exit_code == 0, ran.err
    assert ran.out.strip().splitlines()[-1] == "1"  # no socket to connect to once the agent has
    assert sandbox._live is not None and isinstance(sandbox._live.stream, SocketStream)
    root = provider.launcher.sockets.root
    (name,) = os.listdir(root)  # the container's directory, the socket gone from it
    assert os.listdir(os.path.join(root, name)) == []
    # The agent's end is still seen: killed, its session gets a fresh agent on the next call.
    first = sandbox._live
    agent_signal(docker_client, first.container_id, "KILL")
    await until(lambda: first.broken)
    ran = await run(sandbox, "echo again")
    assert ran.out == "again\n"
    assert sandbox._live is not first and isinstance(sandbox._live.stream, SocketStream)
    await provider.close_session(sandbox.session.session_id)
    assert os.listdir(root) == []  # each directory went with its container


async def test_a_pooled_containers_agent_speaks_on_its_socket_too(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=1)))
    provider.pool.expect_tenants({DEFAULT_TENANT: (None, None)})  # as the server tells it
    provider.pool.start()
    await until(lambda: provider.pool.ready == 1, timeout=60)
    root = provider.launcher.sockets.root
    (name,) = os.listdir(root)
    assert os.listdir(os.path.join(root, name)) == []  # full: no agent starting
    sandbox = provider.sandbox_for(make_provider.session())
    assert isinstance(sandbox, ContainerSandbox)
    ran = await run(sandbox, f"test -e {SOCKET_DIR}/agent.sock; echo $?")
    assert ran.out == "1\n"
    assert sandbox._live is not None and isinstance(sandbox._live.stream, SocketStream)
    assert provider.pool.owns(sandbox._live.container_id)  # the pooled one, adopted


async def test_agent_socket_false_attaches_through_the_daemon(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(agent_socket=False))
    sandbox = provider.sandbox_for(make_provider.session())
    assert isinstance(sandbox, ContainerSandbox)
    assert (await run(sandbox, "echo hi")).out == "hi\n"
    assert sandbox._live is not None and isinstance(sandbox._live.stream, AttachStream)


async def _started(
    provider_factory: ProviderFactory, mount: bool
) -> tuple[ContainerLauncher, str, AgentListener]:
    provider = provider_factory()
    launcher = provider.launcher
    listener = launcher.listen()
    assert listener is not None
    spec = launcher.spec("1000:1000", {LABEL_SPEC: "test"}, [listener.mount] if mount else [])
    container_id = await provider.api.create_container(f"{provider.instance}-socket", spec)
    await provider.api.start(container_id)
    return launcher, container_id, listener


async def test_a_process_that_connects_first_is_turned_away(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, caplog: pytest.LogCaptureFixture
) -> None:
    launcher, container_id, listener = await _started(make_provider, mount=True)
    stranger = docker_client.api.exec_create(container_id, ["python3", "-c", STRANGER], user="1000:1000")
    output = docker_client.api.exec_start(stranger["Id"], stream=True)
    first = await asyncio.to_thread(next, output)
    assert first.startswith(b"connected")  # queued on the listener before the agent starts
    link = await launcher.attach_agent(container_id, "1000:1000", [], listener=listener)
    assert link is not None and isinstance(link[0], SocketStream)
    stream, channel = link
    rest = b"".join(await asyncio.to_thread(list, output))
    assert b"closed" in first + rest  # the server hung up on it without a byte
    assert "closed a connection to the agent socket from pid" in caplog.text
    assert (await channel.stat(".")).kind == "dir"  # and the agent it accepted works
    await channel.close()
    stream.close()


async def test_an_agent_that_cannot_connect_is_attached_through_the_daemon(
    make_provider: ProviderFactory, caplog: pytest.LogCaptureFixture
) -> None:
    launcher, container_id, listener = await _started(make_provider, mount=False)
    link = await launcher.attach_agent(container_id, "1000:1000", [], listener=listener)
    assert link is not None and isinstance(link[0], AttachStream)
    assert (await link[1].stat(".")).kind == "dir"
    assert "could not use the server's socket" in caplog.text and "cannot connect to" in caplog.text
    assert launcher.listen() is None  # later agents: attach at once
    await link[1].close()
    link[0].close()


async def test_a_restarted_server_speaks_to_a_readopted_agent_on_its_socket_not_to_a_lurker(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)))
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    lurker = f'python3 -c "{LURKER}" >/dev/null 2>&1 &'
    assert (await run(sandbox, lurker)).result.exit_code == 0
    container = sandbox.container_id
    assert container is not None
    await first.detach_all()  # a graceful stop that keeps the session: the lurker stays
    # and no agent waits to be rejoined (``test_docker_rejoin.py``): the restarted server must
    # start one, on the socket the lurker hammers.
    agent_signal(docker_client, container, "KILL")

    second = make_provider(SandboxConfig(warm_pool=WarmPoolConfig(size=0)), instance=first.instance)
    second.expect_container(session, container)
    assert await second.remove_orphans() == 0
    await second.adopt_all()
    again = second.sandbox_for(session)
    assert isinstance(again, ContainerSandbox) and again.container_id == container
    assert again._live is not None and isinstance(again._live.stream, SocketStream)
    assert (await run(again, "echo same")).out == "same\n"
    assert "closed a connection to the agent socket from pid" in caplog.text  # the lurker's
    assert caplog.text.count("closed a connection to the agent socket from pid") == 1  # once, however often
    (name,) = os.listdir(second.launcher.sockets.root)
    assert os.listdir(os.path.join(second.launcher.sockets.root, name)) == []
