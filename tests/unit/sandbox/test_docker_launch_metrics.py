"""What the Docker backend tells its SandboxObserver (the launch histogram, the failure and the
removal counters)."""

from __future__ import annotations

import time

import pytest

from dispatcher.core.observe import SandboxFailure, SandboxRemoval
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.image import ImageUnusable
from tests.unit.sandbox.docker_rig import Rig, run
from tests.unit.sandbox.fake_containers import HANG
from tests.unit.sandbox.fake_docker import api_error


class Seen:
    def __init__(self) -> None:
        self.launches: list[float] = []
        self.failures: list[SandboxFailure] = []
        self.removals: list[SandboxRemoval] = []

    def sandbox_launched(self, seconds: float) -> None:
        self.launches.append(seconds)

    def sandbox_failed(self, reason: SandboxFailure) -> None:
        self.failures.append(reason)

    def sandbox_removed(self, reason: SandboxRemoval) -> None:
        self.removals.append(reason)

    def pool_taken(self, hit: bool, seconds: float) -> None:
        pass

    def pool_ready(self, count: int) -> None:
        pass


async def test_launches_and_their_failures_are_reported_by_reason(rig: Rig) -> None:
    seen = Seen()
    provider = rig.provider()
    provider.observer = seen
    rig.fake.fail_next("create_container", api_error(500, "thin pool full"))  # retried: one launch
    assert (await run(provider.sandbox_for(rig.session()), "echo hi")).result.exit_code == 0
    assert len(seen.launches) == 1 and seen.launches[0] >= 0 and seen.failures == []
    rig.fake.fail_next("start", api_error(500, "OCI runtime"), api_error(500, "OCI runtime again"))
    with pytest.raises(SandboxError):
        await run(provider.sandbox_for(rig.session()), "echo hi")
    assert seen.failures == [SandboxFailure.LAUNCH]
    rig.fake.agent_runs = False
    with pytest.raises(ImageUnusable):
        await run(provider.sandbox_for(rig.session()), "echo hi")
    assert seen.failures == [SandboxFailure.LAUNCH, SandboxFailure.IMAGE] and len(seen.launches) == 1


async def test_each_removal_of_a_running_sandbox_is_reported_by_why(rig: Rig) -> None:
    seen = Seen()
    provider = rig.provider(max_lifetime_seconds=1000)
    provider.observer = seen
    sandbox = provider.sandbox_for(rig.session())
    await run(sandbox, "echo hi")
    assert await sandbox.retire_if_idle(time.monotonic() + 700, ttl=600)
    await run(sandbox, "echo hi")
    assert await sandbox.retire_if_idle(time.monotonic() + 1001, ttl=600)
    ran = await run(sandbox, HANG, timeout=0.2, grace=0.1)  # the agent never ends it: enforced
    assert ran.result.killed
    await sandbox.stop_for("over quota")
    assert seen.removals == [SandboxRemoval.IDLE, SandboxRemoval.LIFETIME, SandboxRemoval.ENFORCED]
    assert sandbox.container_id is None  # stop_for found nothing running: nothing counted
