"""A restarted server re-adopting a container launched for its session (not a warm pool's): the
container must still see the session's workspace where ``workspace_path`` names it (fake daemon)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

from dispatcher.core.capabilities import Capabilities
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.provider import ADOPTIONS_PER_LAUNCH_SLOT
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from tests.polling import until
from tests.unit.sandbox.docker_rig import Rig, run


async def launched_then_died(rig: Rig) -> tuple[Session, str]:
    """A session with grants (so never given a pooled container) whose container ran a command,
    then its server died: (session, container)."""
    session = dataclasses.replace(rig.session(), capabilities=Capabilities.of(fs=[(".", "rw")]))
    sandbox = rig.provider().sandbox_for(session)
    await run(sandbox, "x")
    assert sandbox.container_id is not None
    return session, sandbox.container_id


async def test_a_launched_container_that_still_sees_its_workspace_is_readopted(rig: Rig) -> None:
    session, container = await launched_then_died(rig)

    after = rig.provider()
    after.expect_container(session, container)
    assert await after.remove_orphans() == 0
    again = after.sandbox_for(session)
    ran = await run(again, "y")

    assert again.container_id == container and ran.notices == []
    assert os.listdir(session.workspace_path) == []


async def test_a_launched_container_whose_workspace_was_replaced_is_recreated(rig: Rig) -> None:
    session, container = await launched_then_died(rig)
    # While no server ran, the directory was renamed (the container's mount follows it) and
    # another one made at the session's path.
    workspace = Path(session.workspace_path)
    moved = workspace.with_name(workspace.name + "-moved")
    workspace.rename(moved)
    workspace.mkdir()
    rig.fake.containers_by_id[container].moved[str(workspace)] = str(moved)

    after = rig.provider()
    after.expect_container(session, container)
    assert await after.remove_orphans() == 0  # kept by its labels, then checked as it is re-adopted
    again = after.sandbox_for(session)
    ran = await run(again, "y")

    assert again.container_id not in (None, container)  # a fresh one, on the new directory
    assert container not in rig.fake.containers_by_id
    assert any("recreated" in n and "no longer saw the session's workspace" in n for n in ran.notices), (
        ran.notices
    )
    assert rig.fake.containers_by_id[again.container_id].workspace() == str(workspace)
    assert os.listdir(moved) == [] and os.listdir(workspace) == []  # no marker left in either


async def _died_with(rig: Rig, n: int, slots: int) -> list[tuple[Session, str]]:
    """``n`` sessions whose containers ran a command, then their server died."""
    before = rig.provider(max_concurrent_launches=slots)
    died = []
    for _ in range(n):
        session = rig.session()
        sandbox = before.sandbox_for(session)
        await run(sandbox, "x")
        assert sandbox.container_id is not None
        died.append((session, sandbox.container_id))
    return died


def _count_agent_starts(provider: DockerSandboxProvider) -> tuple[list[str], list[int]]:
    """Record, for each agent start of a re-adoption, its session and how many ran at once."""
    started: list[str] = []
    at_once = [0, 0]  # now, most
    start_agent = provider.start_agent

    async def counted(container_id: str, session: Session) -> Any:
        started.append(session.session_id)
        at_once[0] += 1
        at_once[1] = max(at_once)
        try:
            await asyncio.sleep(0.01)  # let every other caller arrive while this one runs
            return await start_agent(container_id, session)
        finally:
            at_once[0] -= 1

    provider.start_agent = counted  # type: ignore[method-assign]
    return started, at_once


async def test_first_calls_after_a_restart_re_attach_a_few_agents_at_a_time(rig: Rig) -> None:
    slots = ADOPTIONS_PER_LAUNCH_SLOT  # with one launch slot
    died = await _died_with(rig, slots + 3, 1)
    after = rig.provider(max_concurrent_launches=1)
    for session, container in died:
        after.expect_container(session, container)
    assert await after.remove_orphans() == 0
    started, at_once = _count_agent_starts(after)

    # Every session's first call at once (a restarted replica's agents all coming back).
    ran = await asyncio.gather(*(run(after.sandbox_for(s), "y") for s, _ in died))

    assert [r.result.exit_code for r in ran] == [0] * len(died)
    assert [after.sandbox_for(s).container_id for s, _ in died] == [c for _, c in died]
    assert sorted(started) == sorted(s.session_id for s, _ in died)  # each re-attached once
    assert at_once[1] == slots  # never more than the adoption slots


async def test_a_call_re_attaches_its_container_ahead_of_the_background_sweep(rig: Rig) -> None:
    died = await _died_with(rig, 5, 1)
    after = rig.provider(max_concurrent_launches=1)
    for session, container in died:
        after.expect_container(session, container)
    assert await after.remove_orphans() == 0
    started, at_once = _count_agent_starts(after)
    sweep = asyncio.create_task(after.adopt_all())
    await until(lambda: len(started) == 1)  # the sweep's one at a time (one launch slot)
    last = died[-1][0]

    ran = await run(after.sandbox_for(last), "y")
    await sweep

    assert ran.result.exit_code == 0 and ran.notices == []
    assert started.index(last.session_id) == 1  # beside the sweep's first, not behind the others
    assert at_once[1] <= 2  # the sweep never ran two at once (the call may run beside it)
    assert sorted(started) == sorted(s.session_id for s, _ in died)  # the sweep did not redo it
