"""The real Docker backend over the fake daemon: a provider, sessions, and calls with their notices."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.sandbox_api import ExecRequest, ExecResult, collect_notices
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.sandbox.docker.client import DockerAPI
from tests.clock import ManualClock
from tests.unit.sandbox.fake_docker import FakeDockerClient

INSTANCE = "unit-fake"
FAST = SandboxConfig(
    workspace_quota=None,  # no loop images in unit tests
    chown_workspace=False,
    pin_cpus=False,
    enforce_slack_seconds=0.2,
    op_timeout_seconds=2.0,
    agent_start_timeout=2.0,
)


@dataclass
class Ran:
    result: ExecResult
    stdout: bytes
    notices: list[str]


@dataclass
class Rig:
    fake: FakeDockerClient
    tmp: Path
    providers: list[DockerSandboxProvider] = field(default_factory=list)

    def provider(self, *, clock: ManualClock | None = None, **config: Any) -> DockerSandboxProvider:
        api = DockerAPI(client=self.fake, attempts=3)
        provider = DockerSandboxProvider(FAST.model_copy(update=config), instance=INSTANCE, api=api)
        if clock is not None:  # containers age and idle only when the test advances it
            provider.clock = clock
        # The seam that keeps mount(2) out of unit tests: Docker gets the pinned paths, and the
        # fake container's view of them is checked by the real _verify_mounts.
        provider.launcher.can_mount = False
        self.providers.append(provider)
        return provider

    def session(self, name: str = "s") -> Session:
        session_id = f"{name}-{uuid.uuid4().hex[:6]}"
        workspace = self.tmp / session_id
        workspace.mkdir()
        return Session(session_id=session_id, workspace_path=str(workspace), tenant_id="t")

    def sandbox(self, *, clock: ManualClock | None = None, **config: Any) -> ContainerSandbox:
        return self.provider(clock=clock, **config).sandbox_for(self.session())


async def run(
    sandbox: ContainerSandbox,
    command: str,
    *,
    timeout: float = 5.0,
    grace: float = 0.1,
    cancel: asyncio.Event | None = None,
    printed: asyncio.Event | None = None,
) -> Ran:
    """Run ``command``; ``printed`` is set when its first output arrives (it is running)."""
    out = bytearray()

    def output(stream: str, data: bytes) -> None:
        if stream == "stdout":
            out.extend(data)
        if printed is not None:
            printed.set()

    with collect_notices() as notices:
        result = await sandbox.exec(
            ExecRequest(command, timeout=timeout, grace_seconds=grace), output, cancel or asyncio.Event()
        )
    return Ran(result, bytes(out), list(notices))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    fake = FakeDockerClient()
    rig = Rig(fake, tmp_path)
    try:
        yield rig
        for provider in rig.providers:
            await provider.aclose()
        left = [c.name for c in fake.containers_alive if c.name.startswith("dispatcher-")]
        assert not left, f"the providers left containers running: {left}"
    finally:
        fake.shutdown()
