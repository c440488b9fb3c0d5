"""A restarted server re-adopting a container launched for its session (not a warm pool's): the
container must still see the session's workspace where ``workspace_path`` names it (fake daemon)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from dispatcher.core.capabilities import Capabilities
from dispatcher.core.sessions.session import Session
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
