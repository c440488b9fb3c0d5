"""Idle containers and orphans are removed; busy ones are spared; old ones are not (fake daemon)."""

from __future__ import annotations

import asyncio
import time

from dispatcher.sandbox.container.labels import (
    LABEL_INSTANCE,
    LABEL_SESSION,
    LABEL_SPEC,
    LABEL_TENANT,
    spec_fingerprint,
)
from dispatcher.sandbox.docker.orphans import adoption_problem
from tests.clock import ManualClock
from tests.polling import until
from tests.unit.sandbox.docker_rig import INSTANCE, Rig, run
from tests.unit.sandbox.fake_containers import BACKGROUND, IGNORE_TERM


async def test_an_idle_container_is_removed_and_the_next_call_says_so(rig: Rig) -> None:
    sandbox = rig.sandbox()
    await run(sandbox, "echo hi")
    assert not await sandbox.retire_if_idle(time.monotonic(), ttl=60)  # not idle yet
    assert await sandbox.retire_if_idle(time.monotonic() + 120, ttl=60)
    assert sandbox.container_id is None and rig.fake.containers_alive == []
    ran = await run(sandbox, "echo again")
    assert ran.result.exit_code == 0
    assert any("it had been idle for" in n for n in ran.notices)
    assert sandbox.recreations == 0  # idleness is not a failure


async def test_a_container_with_background_processes_is_not_idle(rig: Rig) -> None:
    sandbox = rig.sandbox()
    await run(sandbox, BACKGROUND)
    container = sandbox.container_id
    assert not await sandbox.retire_if_idle(time.monotonic() + 120, ttl=60)
    assert sandbox.container_id == container and len(rig.fake.containers_alive) == 1


async def test_the_reaper_removes_idle_containers_on_its_own(rig: Rig) -> None:
    idle, busy = rig.provider(idle_ttl_seconds=0.2), rig.provider(idle_ttl_seconds=0.2)
    quiet, working = idle.sandbox_for(rig.session("quiet")), busy.sandbox_for(rig.session("working"))
    await run(quiet, "echo hi")
    await run(working, BACKGROUND)
    kept = working.container_id
    await until(lambda: quiet.container_id is None, "the idle container to be reaped")
    assert kept is not None
    container = rig.fake.containers_by_id[kept]
    # The busy one is looked at by its reaper (the agent counts its processes) and kept.
    await until(lambda: container.procs_asked >= 2, "the reaper to ask about the busy one twice")
    assert working.container_id == kept and container.state == "running"


async def test_orphans_of_this_instance_are_removed_at_start(rig: Rig) -> None:
    ours = {LABEL_INSTANCE: INSTANCE, LABEL_TENANT: "t"}
    orphan = rig.fake.add_container({**ours, LABEL_SESSION: "gone"})
    stopped = rig.fake.add_container({**ours, LABEL_SESSION: "gone-too"}, state="exited")
    other = rig.fake.add_container({LABEL_INSTANCE: "another-server", LABEL_SESSION: "gone"})
    unlabelled = rig.fake.add_container({})
    provider = rig.provider()
    removed = await provider.remove_orphans()
    assert removed == 2
    assert set(rig.fake.containers_by_id) == {other, unlabelled}
    assert orphan not in rig.fake.containers_by_id and stopped not in rig.fake.containers_by_id


async def test_orphan_removal_spares_live_sessions(rig: Rig) -> None:
    provider = rig.provider()
    sandbox = provider.sandbox_for(rig.session())
    await run(sandbox, "echo hi")
    leftover = rig.fake.add_container({LABEL_INSTANCE: INSTANCE, LABEL_SESSION: "gone"})
    assert await provider.remove_orphans() == 1
    assert sandbox.container_id in rig.fake.containers_by_id and leftover not in rig.fake.containers_by_id


async def test_a_container_past_its_lifetime_is_replaced_at_the_next_call_which_says_so(rig: Rig) -> None:
    clock = ManualClock()
    sandbox = rig.sandbox(max_lifetime_seconds=0.3, clock=clock)
    await run(sandbox, BACKGROUND)  # something left running: the lifetime bounds it anyway
    first = sandbox.container_id
    clock.advance(0.4)
    ran = await run(sandbox, "echo hi")
    assert ran.result.exit_code == 0 and sandbox.container_id not in (None, first)
    assert any("maximum lifetime (0.3 s)" in n and "processes left running" in n for n in ran.notices), (
        ran.notices
    )
    assert first not in rig.fake.containers_by_id and sandbox.recreations == 0  # age is not a failure


async def test_the_reaper_retires_an_old_container_even_with_processes_running(rig: Rig) -> None:
    sandbox = rig.sandbox(max_lifetime_seconds=60)
    await run(sandbox, BACKGROUND)
    assert not await sandbox.retire_if_idle(time.monotonic() + 30, ttl=600)  # young, and working
    assert await sandbox.retire_if_idle(time.monotonic() + 61, ttl=600)
    assert sandbox.container_id is None and rig.fake.containers_alive == []


async def test_without_a_lifetime_a_working_container_stays(rig: Rig) -> None:
    sandbox = rig.sandbox(max_lifetime_seconds=None)
    await run(sandbox, BACKGROUND)
    assert not await sandbox.retire_if_idle(time.monotonic() + 10**7, ttl=600)
    assert sandbox.container_id is not None


def test_a_container_past_its_lifetime_is_not_readopted_after_a_restart(rig: Rig) -> None:
    provider = rig.provider(max_lifetime_seconds=3600)
    session = rig.session()
    labels = {LABEL_INSTANCE: INSTANCE, LABEL_SESSION: session.session_id, LABEL_TENANT: session.tenant_id}
    labels[LABEL_SPEC] = spec_fingerprint(provider.config, session)
    young = {"Labels": labels, "State": "running", "Created": int(time.time()) - 60}
    old = {**young, "Created": int(time.time()) - 3601}
    assert adoption_problem(young, session, INSTANCE, provider.config) is None
    assert "maximum lifetime (3600 s)" in str(adoption_problem(old, session, INSTANCE, provider.config))


async def test_overlapping_calls_cannot_keep_an_old_container(rig: Rig) -> None:
    """New calls wait for the old container's running calls (bounded by their timeouts), then it
    goes: however the calls overlap, no container outlives its lifetime by more than that."""
    clock = ManualClock()
    sandbox = rig.sandbox(max_lifetime_seconds=0.3, clock=clock)
    await run(sandbox, "echo first")
    old = sandbox.container_id
    printed = asyncio.Event()
    running = asyncio.create_task(run(sandbox, IGNORE_TERM, timeout=0.8, grace=0.1, printed=printed))
    await printed.wait()
    clock.advance(0.4)  # old now, and a call still runs in it
    b, c = await asyncio.gather(run(sandbox, "echo b"), run(sandbox, "echo c"))
    first = await running
    assert first.result.timed_out and not any("removed" in n for n in first.notices)  # not cut short
    assert b.stdout == b"ran: echo b\n" and c.stdout == b"ran: echo c\n"
    assert sandbox.container_id not in (None, old) and old not in rig.fake.containers_by_id
    told = [n for n in b.notices + c.notices if "maximum lifetime" in n]
    assert len(told) == 1, b.notices + c.notices  # one retirement, told once; both ran in the new one
