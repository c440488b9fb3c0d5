"""Commands through the agent: streaming, kill sequence, and the Docker API enforcing when it fails."""

from __future__ import annotations

import asyncio
import time

import docker
import pytest

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from tests.integration.conftest import ProviderFactory
from tests.integration.helpers import run
from tests.polling import until

pytestmark = pytest.mark.docker

# Finds the agent without matching itself: this script's own command line holds "agent[.]py".
FIND_AGENT = (
    'for p in /proc/[0-9]*; do case "$(tr "\\0" " " < $p/cmdline 2>/dev/null)" in'
    " *agent[.]py*) echo ${p#/proc/};; esac; done"
)


def agent_signal(client: docker.DockerClient, container_id: str, signal: str) -> None:
    """Signal the agent from outside, through docker exec (as a crash or a hang would look)."""
    container = client.containers.get(container_id)
    code, output = container.exec_run(["sh", "-c", f"kill -{signal} $({FIND_AGENT})"], user="1000:1000")
    assert code == 0, output


async def test_stdin_env_and_cwd(sandbox: ContainerSandbox) -> None:
    await sandbox.write("sub/dir/.keep", "")
    ran = await run(
        sandbox, 'cat; echo "$GREETING"; pwd', stdin=b"from stdin\n", env={"GREETING": "hi"}, cwd="sub/dir"
    )
    assert ran.result.exit_code == 0, ran.err
    assert ran.out == "from stdin\nhi\n/workspace/sub/dir\n"


async def test_exit_code_and_stderr(sandbox: ContainerSandbox) -> None:
    ran = await run(sandbox, "echo oops >&2; exit 7")
    assert ran.result.exit_code == 7 and ran.err == "oops\n"


async def test_parallel_commands_in_one_session(sandbox: ContainerSandbox) -> None:
    started = time.monotonic()
    results = await asyncio.gather(*(run(sandbox, f"sleep 0.5; echo {i}") for i in range(4)))
    assert [r.out for r in results] == [f"{i}\n" for i in range(4)]
    assert time.monotonic() - started < 2.0  # they ran side by side, not one after another


async def test_timeout_keeps_partial_output(sandbox: ContainerSandbox) -> None:
    ran = await run(sandbox, "echo partial; sleep 30", timeout=1)
    assert ran.result.timed_out and ran.result.exit_code is None
    assert ran.out == "partial\n"


async def test_cancel_keeps_partial_output(sandbox: ContainerSandbox) -> None:
    cancel = asyncio.Event()
    seen = asyncio.Event()
    task = asyncio.ensure_future(
        run(sandbox, "echo partial; sleep 30", cancel=cancel, on_chunk=lambda s, d: seen.set())
    )
    await asyncio.wait_for(seen.wait(), 10)
    cancelled_at = time.monotonic()
    cancel.set()
    ran = await asyncio.wait_for(task, 10)
    assert ran.result.cancelled and ran.out == "partial\n"
    assert time.monotonic() - cancelled_at < 1.0  # sleep dies on SIGTERM: no grace needed


async def test_command_ignoring_sigterm_is_killed(sandbox: ContainerSandbox) -> None:
    started = time.monotonic()
    ran = await run(sandbox, "trap '' TERM; echo stubborn; sleep 31 & wait; sleep 31", timeout=1, grace=0.5)
    assert ran.result.timed_out and ran.result.killed
    assert ran.out == "stubborn\n"
    assert time.monotonic() - started < 6
    # Nothing of that process group survived.
    ps = await run(
        sandbox,
        """for p in /proc/[0-9]*; do [ "$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)" = "sleep 31 " ] && echo $p;"""
        " done | wc -l",
    )
    assert ps.out.strip() == "0"


async def test_killed_agent_is_recovered_on_the_next_call(
    sandbox: ContainerSandbox, docker_client: docker.DockerClient
) -> None:
    assert (await run(sandbox, "echo one")).out == "one\n"
    first = sandbox.container_id
    assert first is not None
    agent_signal(docker_client, first, "9")
    await until(lambda: sandbox._live is None or sandbox._live.broken)
    ran = await run(sandbox, "echo two")
    assert ran.out == "two\n"
    assert sandbox.container_id not in (None, first)
    await until(lambda: not _exists(docker_client, first))


async def test_agent_dying_mid_command_fails_the_call_then_recovers(
    sandbox: ContainerSandbox, docker_client: docker.DockerClient
) -> None:
    await run(sandbox, "true")
    first = sandbox.container_id
    assert first is not None
    seen = asyncio.Event()
    task = asyncio.ensure_future(run(sandbox, "echo working; sleep 30", on_chunk=lambda s, d: seen.set()))
    await asyncio.wait_for(seen.wait(), 10)
    agent_signal(docker_client, first, "9")
    with pytest.raises(SandboxError):
        await asyncio.wait_for(task, 10)
    assert not _exists(docker_client, first)
    assert (await run(sandbox, "echo back")).out == "back\n"


async def test_hung_agent_is_stopped_by_the_enforcer(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider(SandboxConfig(op_timeout_seconds=1.0, enforce_slack_seconds=1.0))
    sandbox = provider.sandbox_for(make_provider.session())
    await sandbox.write("f.txt", "x")
    first = sandbox.container_id
    assert first is not None
    agent_signal(docker_client, first, "STOP")
    ran = await run(sandbox, "echo never", timeout=0.5, grace=0.2)
    assert ran.result.killed and ran.result.exit_code is None
    assert not _exists(docker_client, first)
    assert await sandbox.read("f.txt") == "x"  # a new container, same workspace
    assert sandbox.container_id not in (None, first)


def _exists(client: docker.DockerClient, container_id: str) -> bool:
    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True
