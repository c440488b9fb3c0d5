"""The agent's process table in a real container: a background process started through the
session's agent link keeps running, and keeps its output, across a restarted server that
re-adopts the container; a stop leaves nothing of its group. (The host's tools and RPCs for
processes come later; this drives the agent's messages through the link the server has.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any, cast

import docker
import pytest

from dispatcher.core.errors import FailureReason
from dispatcher.core.process_api import OutputChunk, ProcessError, ProcessStart
from dispatcher.sandbox.agent import protocol as p
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import ProcessLimits, SandboxConfig
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


# -- the same table through the host's ProcessControl (``ContainerSandbox.processes()``) -----------

FLOOD = 50 << 20
"""What the flood prints: 50 MiB, with nobody reading."""


async def _agent_rss_kib(sandbox: ContainerSandbox) -> int:
    """The resident memory of the container's agent(s), from /proc, in KiB."""
    script = (
        "t=0; for p in /proc/[0-9]*; do case $(tr '\\0' ' ' < $p/cmdline 2>/dev/null) in"
        " *agent.pyz*) r=$(grep VmRSS $p/status | tr -dc 0-9); t=$((t+r));; esac; done; echo $t"
    )
    ran = await run(sandbox, script)
    assert ran.result.exit_code == 0, ran
    return int(ran.out)


async def test_a_session_without_a_container_lists_none_and_launches_nothing(
    make_provider: ProviderFactory,
) -> None:
    sandbox = make_provider().sandbox_for(make_provider.session())
    table = sandbox.processes()
    assert await table.list() == ()
    with pytest.raises(ProcessError) as caught:
        await table.read("p_1")
    assert caught.value.code == "no_process"
    assert sandbox.container_id is None  # nothing was launched to find nothing


async def test_a_flood_nobody_reads_keeps_the_last_mib_and_counts_what_was_lost(
    make_provider: ProviderFactory,
) -> None:
    sandbox = make_provider().sandbox_for(make_provider.session())
    table = sandbox.processes()
    assert (await run(sandbox, "true")).result.exit_code == 0
    before = await _agent_rss_kib(sandbox)
    await table.start(ProcessStart("p_flood", "dd if=/dev/zero bs=1M count=50 2>/dev/null"))
    ended = await asyncio.wait_for(table.wait("p_flood"), 120)
    after = await _agent_rss_kib(sandbox)
    assert (ended.state, ended.exit_code, ended.end) == ("exited", 0, FLOOD)
    held = ended.end - ended.first
    # The ring holds the newest MiB, less what its pieces cost (64 bytes per piece of <= 64 KiB).
    assert (1 << 20) - 17 * 64 <= held <= 1 << 20
    got = await table.read("p_flood", after=0, max_bytes=1 << 20)
    assert got.lost == ended.first == FLOOD - held  # exact: every byte before the ring is counted
    assert got.chunks[0].cursor == ended.first and got.next == FLOOD
    assert sum(len(c.data) for c in got.chunks) == held
    # The agent's memory did not follow the 50 MiB (one 1 MiB ring, plus the interpreter's noise).
    assert after - before < 16 << 10, (before, after)


async def test_the_running_bound_refuses_one_more_with_what_to_do(make_provider: ProviderFactory) -> None:
    config = SandboxConfig(processes=ProcessLimits(running=3))
    sandbox = make_provider(config).sandbox_for(make_provider.session())
    table = sandbox.processes()
    for n in range(3):
        await table.start(ProcessStart(f"p_{n}", "sleep 60"))
    with pytest.raises(ProcessError) as caught:
        await table.start(ProcessStart("p_3", "sleep 60"))
    assert caught.value.code == "too_many" and caught.value.reason is FailureReason.QUOTA
    assert str(caught.value) == (
        "3 processes are running in this session, the most it allows; stop one with process_stop"
        " (process_list shows them)"
    )
    await table.signal("p_0", "TERM", grace_seconds=2)
    assert (await table.start(ProcessStart("p_3", "sleep 60"))).running  # room again


async def test_a_stdin_flood_is_refused_whole(make_provider: ProviderFactory) -> None:
    config = SandboxConfig(processes=ProcessLimits(stdin_bytes=4096))
    sandbox = make_provider(config).sandbox_for(make_provider.session())
    table = sandbox.processes()
    await table.start(ProcessStart("p_deaf", "sleep 60"))  # never reads its stdin
    # The pipe takes what fits in its buffer; then the bound holds what waits.
    with pytest.raises(ProcessError) as caught:
        for _ in range(64):
            await table.write_input("p_deaf", b"x" * 4096)
    assert caught.value.code == "too_large" and "4096" in str(caught.value)
    assert "wait until it read what it has" in str(caught.value)
    with pytest.raises(ProcessError):
        await table.write_input("p_deaf", b"y" * 4097)  # never fits: refused, not cut
    await table.signal("p_deaf", "KILL", grace_seconds=1)


async def test_a_replaced_container_took_its_processes_and_says_so(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    sandbox = make_provider().sandbox_for(make_provider.session())
    table = sandbox.processes()
    await table.start(ProcessStart("p_gone", "sleep 60"))
    waiting = asyncio.ensure_future(table.wait("p_gone"))
    container = sandbox.container_id
    assert container is not None
    docker_client.containers.get(container).kill()
    with pytest.raises(ProcessError) as caught:
        await asyncio.wait_for(waiting, 30)
    assert caught.value.code == "no_process" and "sandbox was removed" in str(caught.value)
    with pytest.raises(ProcessError) as caught:
        await table.read("p_gone")
    assert "is gone: the session's sandbox was removed since it started" in str(caught.value)
    assert await table.list() == () and sandbox.container_id is None  # none launched to say so


@pytest.mark.parametrize("runtime", [None, "runsc"])
async def test_processes_survive_a_restarted_server_through_process_control(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, runtime: str | None
) -> None:
    if runtime == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    first = make_provider(SandboxConfig(runtime=runtime))
    session = make_provider.session()
    sandbox = first.sandbox_for(session)
    table = sandbox.processes()
    started = await table.start(ProcessStart("p_tick", TICKER, tool_use_id="toolu_1"))
    out = b""
    cursor = 0
    while out.count(b"\n") < 3:
        got = await table.read("p_tick", after=cursor, wait_seconds=5)
        out += b"".join(c.data for c in got.chunks if c.stream == "stdout")
        cursor = got.next
    # Left by exec as well: a foreground command's leftover is a process of the table too.
    left = await run(sandbox, "(while :; do echo left; sleep 0.2; done) & echo now", leave_as="p_left")
    assert left.result.left == ("p_left",)

    container = sandbox.container_id
    assert container is not None
    await first.detach_all()  # the server goes: its channels end, as with a kill -9
    await first.pool.aclose()
    second = make_provider(SandboxConfig(runtime=runtime), instance=first.instance)
    second.expect_container(session, container)
    assert await second.remove_orphans() == 0
    again = second.sandbox_for(session).processes()
    # No adopt_all: the first process op re-adopts the container by itself.
    records = {p.process_id: p for p in await again.list()}
    assert second.sandbox_for(session).container_id == container
    assert records["p_tick"].pid == started.pid and records["p_tick"].running
    assert records["p_left"].running and records["p_left"].origin == "left"
    got = await again.read("p_tick", after=cursor, wait_seconds=5)
    assert got.lost == 0 and got.chunks and got.chunks[0].cursor == cursor  # nothing missed
    watch = again.watch("p_left")
    first_chunk = await anext(watch)
    assert isinstance(first_chunk, OutputChunk) and first_chunk.data.startswith(b"left")
    await cast(AsyncGenerator[object, None], watch).aclose()

    stopped = await again.signal("p_tick", "TERM", grace_seconds=3)
    assert stopped.state == "killed"
    await again.signal("p_left", "KILL", grace_seconds=3)
    check = await run(
        second.sandbox_for(session), f"kill -0 -{started.pid} 2>/dev/null && echo alive || echo gone"
    )
    assert check.out == "gone\n"


async def test_a_watch_of_a_flood_accounts_for_every_byte_whatever_its_consumer(
    make_provider: ProviderFactory,
) -> None:
    """A consumer that stops to think after every few chunks falls behind a 50 MiB flood: its
    watch is ended and begun again from where it is (the host holds at most its bound), and
    every byte is either delivered or counted as lost, in order, exactly once."""
    sandbox = make_provider().sandbox_for(make_provider.session())
    table = sandbox.processes()
    await table.start(ProcessStart("p_flood", "dd if=/dev/zero bs=1M count=50 2>/dev/null"))
    position = delivered = lost = chunks = 0
    end = None
    async for item in table.watch("p_flood"):
        if isinstance(item, OutputChunk):
            assert item.cursor == position + item.lost  # contiguous, gaps said
            position = item.cursor + len(item.data)
            delivered += len(item.data)
            lost += item.lost
            chunks += 1
            if chunks % 4 == 0:
                await asyncio.sleep(0.01)  # a slow consumer, not a wait for anything
        else:
            end = item
    assert end is not None and (end.state, end.end) == ("exited", FLOOD)
    assert delivered + lost == FLOOD and lost > 0  # it did fall behind, and nothing went uncounted
