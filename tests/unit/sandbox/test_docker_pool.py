"""The warm pool over the fake daemon: filled to its size, adopted once, confirmed, drained, reaped.

Mounts are the one seam: ``FakeSlotMounts`` records what would be mounted on each slot, and the
fake agent answers ``stat`` from the directory the container would see at /workspace.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

from dispatcher.core.capabilities import Capabilities, FsGrant
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import (
    WarmPoolConfig,
)
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_POOL, LABEL_SESSION, LABEL_TENANT
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.sandbox.docker.pool.adopt import SlotMounts
from dispatcher.sandbox.docker.pool.shares import DEMAND_WINDOW
from tests.polling import until
from tests.unit.sandbox.docker_rig import Rig, run
from tests.unit.sandbox.fake_docker import FakeDockerClient


class FakeSlotMounts(SlotMounts):
    """Slots as plain directories; a "mount" is an entry in the fake daemon's table."""

    def __init__(self, fake: FakeDockerClient, where: Path, *, propagate: bool = True) -> None:
        super().__init__()
        self.fake = fake
        self.where = where
        self.propagate = propagate
        self.released: list[str] = []

    def available(self) -> bool:
        return True

    def make(self, slots_dir: str) -> str:
        self.where.mkdir(exist_ok=True)
        return tempfile.mkdtemp(dir=self.where)

    def attach(self, slot: str, fd: int) -> None:
        if self.propagate:  # False: the container never sees what is mounted
            self.fake.slot_mounts[slot] = os.readlink(f"/proc/self/fd/{fd}")

    def release(self, slot: str) -> None:
        self.fake.slot_mounts.pop(slot, None)
        self.released.append(slot)
        os.rmdir(slot)

    def owns(self, slots_dir: str, path: str) -> bool:
        return os.path.dirname(path) == str(self.where)

    def release_stale(self, slots_dir: str, keep: Collection[str] = ()) -> None:
        pass


def pooled(rig: Rig, size: int, **config: Any) -> DockerSandboxProvider:
    provider = rig.provider(warm_pool=WarmPoolConfig(size=size), **config)
    provider.pool.mounts = FakeSlotMounts(rig.fake, rig.tmp / "slots")
    provider.pool.expect_tenants({"t": (None, None)})  # the rig's sessions' tenant, as the config says
    return provider


async def filled(rig: Rig, size: int) -> DockerSandboxProvider:
    """A pooled provider after its start-up sweep (which starts the filling), once full."""
    provider = pooled(rig, size)
    await provider.remove_orphans()
    await until(lambda: provider.pool.ready == size, "the pool to fill")
    return provider


def reserved(provider: DockerSandboxProvider, session: Session) -> Session:
    """``session`` named as the session manager names a new one: after a pooled container."""
    session_id = provider.reserve_session_id(session)
    assert session_id is not None, "no pooled container for the session"
    return dataclasses.replace(session, session_id=session_id)


def pool_containers(fake: FakeDockerClient) -> set[str]:
    return {c.id for c in fake.containers_alive if c.labels.get(LABEL_POOL)}


async def test_the_pool_fills_to_its_size_and_a_session_adopts_one(rig: Rig) -> None:
    provider = await filled(rig, 2)
    waiting = pool_containers(rig.fake)
    assert len(waiting) == 2
    session = reserved(provider, rig.session("adopt"))
    sandbox = provider.sandbox_for(session)

    ran = await run(sandbox, "hello")

    assert ran.stdout == b"ran: hello\n"
    assert sandbox.container_id in waiting
    assert provider.pool.hits == 1 and provider.pool.misses == 0
    slot = next(s for s, ws in rig.fake.slot_mounts.items() if ws == session.workspace_path)
    assert os.listdir(session.workspace_path) == []  # the marker the agent saw is gone
    # Refilled to its size, never past it: two waiting, one adopted.
    await until(lambda: provider.pool.ready == 2, "the refill")
    assert len(pool_containers(rig.fake)) == 3
    assert rig.fake.calls.count("create_container") == 3
    assert slot not in provider.pool.mounts.released  # type: ignore[attr-defined]


async def test_an_adopted_container_serves_one_session_and_leaves_with_it(rig: Rig) -> None:
    provider = await filled(rig, 1)
    first = reserved(provider, rig.session("one"))
    sandbox = provider.sandbox_for(first)
    await run(sandbox, "x")
    used = sandbox.container_id
    await provider.close_session(first.session_id)

    assert used not in rig.fake.containers_by_id  # removed with its session, never pooled again
    assert not any(ws == first.workspace_path for ws in rig.fake.slot_mounts.values())
    await until(lambda: provider.pool.ready == 1, "the refill")
    second = provider.sandbox_for(reserved(provider, rig.session("two")))
    await run(second, "y")
    assert second.container_id not in (None, used)


async def test_an_empty_pool_is_a_miss_and_the_session_launches_as_before(rig: Rig) -> None:
    provider = pooled(rig, 2)  # never started: nothing waits
    sandbox = provider.sandbox_for(rig.session())

    ran = await run(sandbox, "cold")

    assert ran.stdout == b"ran: cold\n"
    assert provider.pool.misses == 1 and provider.pool.hits == 0
    assert sandbox.container_id not in pool_containers(rig.fake)


async def test_a_container_that_does_not_see_the_workspace_is_discarded(rig: Rig) -> None:
    provider = pooled(rig, 1)
    provider.pool.mounts = FakeSlotMounts(rig.fake, rig.tmp / "slots", propagate=False)
    await provider.remove_orphans()
    await until(lambda: provider.pool.ready == 1, "the pool to fill")
    waiting = pool_containers(rig.fake)
    sandbox = provider.sandbox_for(reserved(provider, rig.session()))

    await run(sandbox, "z")

    assert provider.pool.misses == 1 and provider.pool.hits == 0
    assert sandbox.container_id not in waiting
    assert not waiting & set(rig.fake.containers_by_id)  # the refused one is removed


async def test_shutdown_drains_the_pool(rig: Rig) -> None:
    provider = await filled(rig, 3)
    mounts = provider.pool.mounts

    await provider.aclose()

    assert not pool_containers(rig.fake)
    assert len(mounts.released) == 3  # type: ignore[attr-defined]
    assert not list((rig.tmp / "slots").iterdir())


async def test_a_restarted_server_removes_the_previous_pool_as_orphans(rig: Rig) -> None:
    before = pooled(rig, 2)
    await before.remove_orphans()
    await until(lambda: before.pool.ready == 2, "the pool to fill")
    left = pool_containers(rig.fake)
    before.pool._closed = True  # the process died: it makes nothing more

    after = rig.provider()  # same instance, no pool
    removed = await after.remove_orphans()

    assert removed == 2
    assert not left & set(rig.fake.containers_by_id)


def test_sessions_with_fs_grants_launch_as_before(rig: Rig) -> None:
    provider = pooled(rig, 1)
    plain = rig.session()
    granted = Session(
        session_id="g",
        workspace_path=plain.workspace_path,
        capabilities=Capabilities(fs_grants=(FsGrant("src", "r"),)),
    )

    assert provider.pool.usable_for(plain)
    assert not provider.pool.usable_for(granted)
    assert not pooled(rig, 1, runtime="runsc").pool.usable_for(plain)
    assert not pooled(rig, 0).pool.usable_for(plain)


async def test_a_session_waits_for_the_container_being_made_for_it(rig: Rig) -> None:
    provider = pooled(rig, 1)
    await provider.remove_orphans()  # the fill starts; nothing is ready yet
    sandbox = provider.sandbox_for(reserved(provider, rig.session()))

    await run(sandbox, "early")

    assert provider.pool.hits == 1 and provider.pool.misses == 0
    assert rig.fake.calls.count("create_container") >= 1


async def test_the_pool_follows_the_users_that_ask(rig: Rig) -> None:
    provider = await filled(rig, 2)
    default = pool_containers(rig.fake)

    def own_ids() -> Session:
        return dataclasses.replace(rig.session("tenant"), sandbox_uid=2001, sandbox_gid=2001)

    # One ask moves at most one share: the default user's waiting containers stay.
    await run(provider.sandbox_for(own_ids()), "first")  # none for it: launches its own
    assert provider.pool.misses == 1 and default <= pool_containers(rig.fake)
    # Once its asks are all the latest ones, the whole pool is its.
    for _ in range(DEMAND_WINDOW - 1):
        await run(provider.sandbox_for(own_ids()), "more")
    await until(lambda: provider.pool.ready == 2 and not default & set(rig.fake.containers_by_id), "the turn")
    users = {c.spec["user"] for c in rig.fake.containers_alive if c.labels.get(LABEL_POOL)}
    assert users == {"2001:2001"}
    await run(provider.sandbox_for(reserved(provider, own_ids())), "pooled")
    assert provider.pool.hits == 1


async def test_an_adopted_container_carries_its_sessions_labels(rig: Rig) -> None:
    provider = await filled(rig, 1)
    session = reserved(provider, rig.session())
    sandbox = provider.sandbox_for(session)

    await run(sandbox, "x")

    container = rig.fake.containers_by_id[str(sandbox.container_id)]
    assert container.labels[LABEL_SESSION] == session.session_id  # made for it, before it existed
    assert container.labels[LABEL_TENANT] == "t"
    assert container.labels[LABEL_INSTANCE] == provider.instance
    assert provider.pool.hits == 1


async def test_a_session_without_a_reservation_never_adopts_one(rig: Rig) -> None:
    provider = await filled(rig, 2)
    waiting = pool_containers(rig.fake)
    sandbox = provider.sandbox_for(rig.session("own-id"))  # named elsewhere: no container has its label

    await run(sandbox, "x")

    assert sandbox.container_id not in waiting
    assert rig.fake.containers_by_id[str(sandbox.container_id)].labels[LABEL_SESSION].startswith("own-id-")
    assert provider.pool.misses == 1 and provider.pool.ready == 2  # the waiting ones stay waiting


async def test_a_reserved_container_whose_session_closes_first_serves_no_other(rig: Rig) -> None:
    provider = await filled(rig, 1)
    [kept] = pool_containers(rig.fake)
    gone = reserved(provider, rig.session("gone"))

    await provider.close_session(gone.session_id)  # before its sandbox ever started

    await until(lambda: kept not in rig.fake.containers_by_id, "the reserved container's removal")
    await until(lambda: provider.pool.ready == 1, "the refill")
    later = reserved(provider, rig.session("later"))
    assert later.session_id != gone.session_id
    sandbox = provider.sandbox_for(later)
    await run(sandbox, "y")
    assert sandbox.container_id != kept and provider.pool.hits == 1


async def test_a_container_reserved_while_being_made_is_removed_when_its_session_left(rig: Rig) -> None:
    provider = pooled(rig, 1)
    await provider.remove_orphans()  # the fill starts; nothing is ready yet
    gone = reserved(provider, rig.session("gone"))
    provider.release_session_id(gone.session_id)  # the session was never opened

    # It is made, then removed (never waiting for another session); the refill makes a new one.
    await until(lambda: provider.pool.ready == 1, "the refill")
    [waiting] = pool_containers(rig.fake)
    assert rig.fake.containers_by_id[waiting].labels[LABEL_SESSION] != gone.session_id
    assert not [c for c in rig.fake.containers_alive if c.labels.get(LABEL_SESSION) == gone.session_id]


async def adopted_then_died(rig: Rig) -> tuple[Session, str, str]:
    """A session that adopted a pooled container, then its server died: (session, container, slot)."""
    before = pooled(rig, 1)
    await before.remove_orphans()
    await until(lambda: before.pool.ready == 1, "the pool to fill")
    session = reserved(before, rig.session())
    sandbox = before.sandbox_for(session)
    await run(sandbox, "x")
    assert sandbox.container_id is not None
    [slot] = [s for s, ws in rig.fake.slot_mounts.items() if ws == session.workspace_path]
    before.pool._closed = True  # the process died: it makes nothing more
    return session, sandbox.container_id, slot


async def test_a_restarted_server_readopts_a_pooled_sessions_container(rig: Rig) -> None:
    session, adopted, slot = await adopted_then_died(rig)

    after = pooled(rig, 1)  # same instance; the session is given back with its stored container
    after.expect_container(session, adopted)
    await after.remove_orphans()  # the old pool's waiting container is an orphan; this one is not

    assert adopted in rig.fake.containers_by_id
    again = after.sandbox_for(session)
    ran = await run(again, "z")
    assert again.container_id == adopted and ran.notices == []  # the same container, confirmed
    mounts = after.pool.mounts
    assert slot not in mounts.released  # type: ignore[attr-defined]
    await after.close_session(session.session_id)
    assert slot in mounts.released  # type: ignore[attr-defined]  # its slot went with it


async def test_a_pooled_container_that_lost_its_workspace_is_not_readopted(rig: Rig) -> None:
    session, adopted, slot = await adopted_then_died(rig)
    del rig.fake.slot_mounts[slot]  # the mount did not outlive the old server (a private namespace)

    after = pooled(rig, 1)
    after.expect_container(session, adopted)
    await after.remove_orphans()
    again = after.sandbox_for(session)
    ran = await run(again, "z")

    assert again.container_id not in (None, adopted)  # its agent did not see the workspace: a fresh one
    assert adopted not in rig.fake.containers_by_id
    assert any("recreated" in n and "re-attached" in n for n in ran.notices), ran.notices


async def test_a_kept_pooled_container_closed_before_its_readoption_takes_its_slot_along(rig: Rig) -> None:
    session, adopted, slot = await adopted_then_died(rig)
    after = pooled(rig, 1)
    after.expect_container(session, adopted)
    await after.remove_orphans()  # kept, its slot too; re-adopted at the first call, which never comes

    await after.close_session(session.session_id)

    assert adopted not in rig.fake.containers_by_id
    assert slot in after.pool.mounts.released  # type: ignore[attr-defined]
    assert not after.pool.owns(adopted)
