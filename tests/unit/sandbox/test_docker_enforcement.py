"""Enforcement and retries of the Docker sandbox, over a fake daemon (no Docker needed).

The real ``ContainerSandbox``/``DockerSandboxProvider``/``DockerAPI`` run; only the daemon and the
programs in its containers are fakes (``fake_docker.py``).
"""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.core.sandbox_api import SandboxError
from tests.polling import until
from tests.unit.sandbox.docker_rig import Rig, run
from tests.unit.sandbox.fake_containers import BACKGROUND, DIE, HANG, IGNORE_TERM, PROC_LIMIT


async def test_a_command_the_agent_cannot_end_costs_its_container(rig: Rig) -> None:
    sandbox = rig.sandbox()
    ran = await run(sandbox, HANG, timeout=0.1, grace=0.1)
    first = ran.result
    assert first.killed and first.timed_out and first.exit_code is None
    assert ran.stdout == b"started\n"  # what it printed before is kept
    assert any("command outlived its kill sequence" in n for n in ran.notices)
    assert sandbox.container_id is None and rig.fake.containers_alive == []

    again = await run(sandbox, "echo back")
    assert again.result.exit_code == 0 and again.stdout == b"ran: echo back\n"
    assert any("recreated for this call" in n for n in again.notices)
    assert sandbox.recreations == 1 and len(rig.fake.containers_alive) == 1


async def test_sigterm_ignored_is_killed_by_the_agent_and_the_container_stays(rig: Rig) -> None:
    sandbox = rig.sandbox()
    await run(sandbox, "warm up")
    container = sandbox.container_id
    ran = await run(sandbox, IGNORE_TERM, timeout=0.1, grace=0.1)
    assert ran.result.killed and ran.result.timed_out and ran.result.signal == 9
    assert ran.notices == [] and sandbox.container_id == container and sandbox.recreations == 0


async def test_cancelling_a_hung_command_removes_its_container(rig: Rig) -> None:
    sandbox = rig.sandbox()
    cancel = asyncio.Event()
    call = asyncio.create_task(run(sandbox, HANG, timeout=60, grace=0.1, cancel=cancel))
    await until(lambda: any(ex.running and ex.cmd[0] == "python3" for ex in rig.fake.execs.values()))
    await until(lambda: sandbox.container_id is not None)
    cancel.set()
    ran = await asyncio.wait_for(call, 10)
    assert ran.result.cancelled and ran.result.killed and not ran.result.timed_out
    assert sandbox.container_id is None and rig.fake.containers_alive == []


async def test_a_container_dying_under_a_silent_command_is_retried_once_with_a_notice(rig: Rig) -> None:
    sandbox = rig.sandbox()
    ran = await run(sandbox, DIE)
    assert ran.result.exit_code == 0 and ran.stdout == f"ran: {DIE}\n".encode()
    assert any("ran once more in a fresh sandbox" in n for n in ran.notices)
    assert rig.fake.calls.count("create_container") == 2 and len(rig.fake.containers_alive) == 1


async def test_a_second_death_is_not_retried(rig: Rig) -> None:
    rig.fake.deaths_left = 2
    sandbox = rig.sandbox()
    with pytest.raises(SandboxError, match="container stopped"):
        await run(sandbox, DIE)
    assert rig.fake.calls.count("create_container") == 2
    assert sandbox.container_id is None and rig.fake.containers_alive == []


async def test_a_container_that_died_between_calls_is_replaced_with_a_notice(rig: Rig) -> None:
    sandbox = rig.sandbox()
    await run(sandbox, "first")
    dead = sandbox.container_id
    assert dead is not None
    rig.fake.kill(dead)  # Docker reports the death; the agent's stream ends with it
    await until(lambda: sandbox._live is not None and sandbox._live.broken, "the sandbox to notice")
    ran = await run(sandbox, "second")
    assert ran.result.exit_code == 0 and sandbox.container_id not in (None, dead)
    assert any("its agent or its container had died" in n for n in ran.notices)
    assert dead not in rig.fake.containers_by_id  # removed, not only stopped


async def test_an_exhausted_process_limit_kills_the_leftovers_and_runs_the_command(rig: Rig) -> None:
    sandbox = rig.sandbox(pids_limit=64)
    for _ in range(3):
        await run(sandbox, BACKGROUND)
    container = sandbox.container_id
    ran = await run(sandbox, PROC_LIMIT)
    assert ran.result.exit_code == 0 and sandbox.container_id == container
    assert any("exhausted by 3 leftover processes; they were killed (3 processes" in n for n in ran.notices)


async def test_a_file_operation_the_agent_never_answers_costs_its_container(rig: Rig) -> None:
    sandbox = rig.sandbox(op_timeout_seconds=0.2)
    assert not await sandbox.exists("notes.txt")
    with pytest.raises(SandboxError, match="did not answer; it will be recreated"):
        await sandbox.exists(HANG)
    assert sandbox.container_id is None and rig.fake.containers_alive == []
    ran = await run(sandbox, "echo next")
    assert ran.result.exit_code == 0 and any("exists: agent did not answer" in n for n in ran.notices)


async def test_dockers_death_event_alone_breaks_the_channel(rig: Rig) -> None:
    """gVisor can leave the exec stream of a dead container open: the die event must suffice."""
    sandbox = rig.sandbox()
    await run(sandbox, "first")
    live = sandbox._live
    assert live is not None and live.channel is not None
    await until(lambda: rig.fake.watchers == 1, "the provider to watch container deaths")
    rig.fake.kill(live.container_id, streams_survive=True)
    await until(lambda: live.broken, "the death event to break the channel")
    ran = await run(sandbox, "second")
    assert ran.result.exit_code == 0 and sandbox.container_id != live.container_id
    assert any("its agent or its container had died" in n for n in ran.notices)
