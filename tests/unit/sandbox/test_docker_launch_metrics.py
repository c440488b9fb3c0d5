"""What the Docker backend tells its SandboxObserver (the launch histogram and failure counter)."""

from __future__ import annotations

import pytest

from dispatcher.core.observe import SandboxFailure
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.docker.image_check import ImageUnusable
from tests.unit.sandbox.docker_rig import Rig, run
from tests.unit.sandbox.fake_docker import api_error


class Seen:
    def __init__(self) -> None:
        self.launches: list[float] = []
        self.failures: list[SandboxFailure] = []

    def sandbox_launched(self, seconds: float) -> None:
        self.launches.append(seconds)

    def sandbox_failed(self, reason: SandboxFailure) -> None:
        self.failures.append(reason)


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
