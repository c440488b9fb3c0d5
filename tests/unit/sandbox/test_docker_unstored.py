"""A server that died between launching a session's container and storing its id: the restarted
server finds the container by its labels instead of removing it as an orphan (fake daemon)."""

from __future__ import annotations

from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.sandbox.docker.config import LABEL_SESSION
from tests.unit.sandbox.docker_rig import Rig, run


def restarted(rig: Rig) -> tuple[DockerSandboxProvider, list[tuple[str, str | None]]]:
    """A new provider of the same instance, and what it tells the server's store."""
    provider = rig.provider()
    stored: list[tuple[str, str | None]] = []
    provider.on_container = lambda session_id, container_id: stored.append((session_id, container_id))
    return provider, stored


async def test_a_container_whose_id_was_never_stored_is_readopted_by_its_labels(rig: Rig) -> None:
    before = rig.provider()
    session = rig.session()
    sandbox = before.sandbox_for(session)
    await run(sandbox, "echo one > /tmp/x")
    launched = sandbox.container_id
    assert launched is not None  # then the server died before its state writer stored the id

    after, stored = restarted(rig)
    after.sandbox_for(session).expect_labelled()  # given back with no stored container
    assert await after.remove_orphans() == 0

    again = after.sandbox_for(session)
    ran = await run(again, "y")
    assert again.container_id == launched and ran.notices == []
    assert stored == [(session.session_id, launched)]  # stored now


async def test_of_several_containers_with_its_labels_the_newest_is_readopted(rig: Rig) -> None:
    before = rig.provider()
    session = rig.session()
    old = before.sandbox_for(session)
    await run(old, "x")
    stale = old.container_id
    assert stale is not None
    rig.fake.containers_by_id[stale].created -= 60  # an older one (a launch that was retried)
    other = rig.provider()  # a second launch of the same session, as a retry would make
    newer = other.sandbox_for(session)
    await run(newer, "x")
    assert newer.container_id not in (None, stale)

    after, _ = restarted(rig)
    after.sandbox_for(session).expect_labelled()
    assert await after.remove_orphans() == 1  # the older one

    again = after.sandbox_for(session)
    await run(again, "y")
    assert again.container_id == newer.container_id
    assert stale not in rig.fake.containers_by_id


async def test_a_session_with_no_container_left_launches_one_and_others_are_still_orphans(rig: Rig) -> None:
    before = rig.provider()
    lost = rig.session("lost")
    await run(before.sandbox_for(rig.session("closed-meanwhile")), "x")  # a session not given back

    after, _ = restarted(rig)
    sandbox = after.sandbox_for(lost)
    sandbox.expect_labelled()
    assert await after.remove_orphans() == 1
    assert sandbox.unstored is False

    ran = await run(sandbox, "y")
    assert ran.notices == [] and sandbox.container_id is not None
    labels = rig.fake.containers_by_id[sandbox.container_id].labels
    assert labels[LABEL_SESSION] == lost.session_id
