"""Fixtures: a local agent sandbox over the workspace (workspace and outside: tests/unit/conftest.py);
``rig``: the Docker backend over a fake daemon."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.sandbox.local import LocalSandbox
from tests.unit.sandbox.docker_rig import rig

__all__ = ["rig"]  # the Docker backend over a fake daemon (tests/unit/sandbox/fake_docker.py)


@pytest.fixture
async def sandbox(workspace: Path) -> AsyncIterator[LocalSandbox]:
    sb = LocalSandbox(str(workspace), kill_wait=1.0)
    yield sb
    await sb.aclose()
