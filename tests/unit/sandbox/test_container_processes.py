"""A container sandbox's process ops over the fake daemon running the real agent: what a paused
session does, and what a removed container's processes become."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.core.process_api import ProcessError, ProcessStart
from dispatcher.core.sandbox_api import ExecRequest
from dispatcher.sandbox.container.processes import SessionPaused
from tests.contract.real_agent import run_real_agent
from tests.unit.sandbox.docker_rig import Rig


async def test_a_paused_session_refuses_short_ops_and_its_waits_resume_with_it(rig: Rig) -> None:
    rig.fake.agent_program = run_real_agent
    sandbox = rig.sandbox(agent_start_timeout=30.0, op_timeout_seconds=30.0)
    table = sandbox.processes()
    await table.start(ProcessStart("p_short", "exit 3"))
    assert (await table.wait("p_short")).exit_code == 3  # ended: a wait's first look answers it
    sandbox.paused = True  # what pause() records (the fake daemon's freeze is a no-op)
    with pytest.raises(SessionPaused, match="the session is paused"):
        await table.list()
    waiting = asyncio.ensure_future(table.wait("p_short"))
    # Unpaused, the first look (at once, one round trip) would answer; paused, nothing is asked.
    done, _ = await asyncio.wait([waiting], timeout=0.5)
    assert not done
    sandbox.paused = False
    ended = await asyncio.wait_for(waiting, 10)
    assert (ended.state, ended.exit_code) == ("exited", 3)


async def test_a_removed_container_took_its_processes_and_no_process_says_why(rig: Rig) -> None:
    rig.fake.agent_program = run_real_agent
    sandbox = rig.sandbox(agent_start_timeout=30.0, op_timeout_seconds=30.0)
    table = sandbox.processes()
    await table.start(ProcessStart("p_old", "sleep 60"))
    request = ExecRequest("(sleep 60; echo late) & true", timeout=5, leave_as="p_left")
    assert (await sandbox.exec(request, lambda *_: None, asyncio.Event())).left == ("p_left",)
    await sandbox.stop_for("the tenant's disk quota was exceeded")
    for process_id in ("p_old", "p_left"):  # started, or left running by a command
        with pytest.raises(ProcessError) as caught:
            await table.read(process_id)
        assert str(caught.value).startswith(
            f"process {process_id!r} is gone: the session's sandbox was removed since it started"
            " (the tenant's disk quota was exceeded), and its processes ended with it"
        )
    assert await table.list() == () and sandbox.container_id is None
    await table.start(ProcessStart("p_new", "true"))  # a start launches a fresh one
    with pytest.raises(ProcessError) as caught:
        await table.signal("p_never", "TERM")
    assert "the session's sandbox was removed (the tenant's disk quota was exceeded)" in str(caught.value)
