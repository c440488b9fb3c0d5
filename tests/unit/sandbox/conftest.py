"""Fixtures: a local agent sandbox over the workspace (workspace and outside: tests/unit/conftest.py);
``rig``: the Docker backend over a fake daemon; ``channel`` to a scripted agent, ``fake``
(``channel_rig.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.local import LocalSandbox
from tests.unit.sandbox.channel_rig import FakeAgent
from tests.unit.sandbox.docker_rig import rig

__all__ = ["rig"]  # the Docker backend over a fake daemon (tests/unit/sandbox/fake_docker.py)


@pytest.fixture
async def sandbox(workspace: Path) -> AsyncIterator[LocalSandbox]:
    # kill_wait bounds the wait for a killed group's exit; a busy machine must not turn it into
    # AgentUnresponsive.
    sb = LocalSandbox(str(workspace), kill_wait=30.0)
    yield sb
    await sb.aclose()


@pytest.fixture
async def fake() -> FakeAgent:
    return FakeAgent()


@pytest.fixture
async def channel(fake: FakeAgent) -> AsyncIterator[AgentChannel]:
    ch = AgentChannel(fake.reader, fake, workspace_root="/workspace", max_frame=1 << 20, kill_wait=0.1)
    yield ch
    await ch.close()
