"""The agent's process table in a real container: a background process started through the
session's agent link keeps running, and keeps its output, across a restarted server that
re-adopts the container; a stop leaves nothing of its group. (The host's tools and RPCs for
processes come later; this drives the agent's messages through the link the server has.)"""

from __future__ import annotations

import time
from typing import Any

import docker
import pytest

from dispatcher.sandbox.agent import protocol as p
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from tests.integration.conftest import ProviderFactory
from tests.integration.helpers import run, runsc_available

pytestmark = pytest.mark.docker

TICKER = "i=0; while :; do echo tick $i; echo warn $i >&2; i=$((i+1)); sleep 0.05; done"


def _link(sandbox: ContainerSandbox) -> AgentChannel:
    """The session's agent link (the host has no process API yet)."""
    live = sandbox._live
    assert live is not None and live.channel is not None
    return live.channel


async def _read(link: AgentChannel, after: int, until: Any) -> tuple[p.ProcOutput, bytes, bytes]:
    """Output from ``after`` until ``until(stdout)`` holds (each read waits for more)."""
    out, err = b"", b""
    deadline = time.monotonic() + 20
    while True:
        got = await link.call(p.ProcRead("p_tick", after, wait_seconds=5, max_bytes=p.MAX_READ))
        assert got.lost == 0
        out += b"".join(c.data for c in got.chunks if c.stream == "stdout")
        err += b"".join(c.data for c in got.chunks if c.stream == "stderr")
        after = got.next
        if until(out) or time.monotonic() > deadline:
            return got, out, err


@pytest.mark.parametrize("runtime", [None, "runsc"])  # the agent on a socket, or attached
async def test_a_background_process_outlives_the_server_that_started_it(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, runtime: str | None
) -> None:
    if runtime == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    first = make_provider(SandboxConfig(runtime=runtime))
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, "true")).result.exit_code == 0  # the container and its agent
    link = _link(sandbox)
    started = await link.call(p.ProcStart("p_tick", TICKER, tool_use_id="toolu_1"))
    assert started.state == "running" and started.tool_use_id == "toolu_1"
    again_id = await link.call(p.ProcStart("p_tick", TICKER))  # a retried start: the same process
    assert again_id.pid == started.pid
    got, out, err = await _read(link, 0, lambda o: b"tick 3\n" in o)
    assert out.startswith(b"tick 0\ntick 1\n") and err.startswith(b"warn 0\n")
    cursor = got.next

    # The server goes away (its channel closes, as with a kill -9) and a new one re-adopts.
    container = sandbox.container_id
    assert container is not None
    await first.detach_all()
    await first.pool.aclose()
    second = make_provider(SandboxConfig(runtime=runtime), instance=first.instance)
    second.expect_container(session, container)
    assert await second.remove_orphans() == 0
    await second.adopt_all()
    again = second.sandbox_for(session)
    assert again.container_id == container
    assert (await run(again, "echo still")).out == "still\n"
    link = _link(again)
    [record] = (await link.call(p.ProcListRequest())).processes
    assert (record.process_id, record.pid, record.state) == ("p_tick", started.pid, "running")
    # Nothing of what it printed while no server was there is lost: it reads on from the cursor.
    _, out, _ = await _read(link, cursor, lambda o: o.count(b"\n") >= 5)
    first_line = int(out.split(b"\n")[0].split()[1])
    assert out.startswith(b"tick ") and first_line >= 4

    stopped = await link.call(p.ProcSignal("p_tick", "TERM", grace_seconds=3))
    assert stopped.state == "killed"
    check = await run(again, f"kill -0 -{started.pid} 2>/dev/null && echo alive || echo gone")
    assert check.out == "gone\n"
