"""A server that died between launching a session's container and storing its id: the restarted
server finds the container by its labels instead of removing it as an orphan (fake daemon)."""

from __future__ import annotations

from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.labels import LABEL_SESSION
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from tests.unit.sandbox.docker_rig import Rig, run


def restarted(rig: Rig) -> tuple[DockerSandboxProvider, list[tuple[str, str | None]]]:
    """A new provider of the same instance, and what it tells the server's store."""
    provider = rig.provider()
    stored: list[tuple[str, str | None]] = []
    provider.on_container = lambda session_id, container_id: stored.append((session_id, container_id))
    return provider, stored


async def launched(provider: DockerSandboxProvider, session: Session) -> str:
    """The id of a container ``provider`` launched for ``session``, which ran a command in it."""
    sandbox = provider.sandbox_for(session)
    await run(sandbox, "echo one > /tmp/x")
    assert sandbox.container_id is not None
    return sandbox.container_id


async def test_a_container_whose_id_was_never_stored_is_readopted_by_its_labels(rig: Rig) -> None:
    session = rig.session()
    first = await launched(rig.provider(), session)  # then the server died before storing its id

    after, stored = restarted(rig)
    after.sandbox_for(session).expect_labelled()  # given back with no stored container
    assert await after.remove_orphans() == 0

    again = after.sandbox_for(session)
    ran = await run(again, "y")
    assert again.container_id == first and ran.notices == []
    assert stored == [(session.session_id, first)]  # stored now


async def test_of_several_containers_with_its_labels_the_newest_is_readopted(rig: Rig) -> None:
    session = rig.session()
    stale = await launched(rig.provider(), session)
    rig.fake.containers_by_id[stale].created -= 60  # an older one (a launch that was retried)
    newer = await launched(rig.provider(), session)  # a second launch, as a retry would make
    assert newer != stale

    after, _ = restarted(rig)
    after.sandbox_for(session).expect_labelled()
    assert await after.remove_orphans() == 1  # the older one

    again = after.sandbox_for(session)
    await run(again, "y")
    assert again.container_id == newer
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
