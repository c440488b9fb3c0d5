"""Fixtures: a temporary workspace, a directory outside it, and a local agent sandbox over it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.sandbox.local import LocalSandbox


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a secret that must stay unreachable."""
    other = tmp_path / "outside"
    other.mkdir()
    (other / "secret.txt").write_text("top secret\n")
    return other


@pytest.fixture
async def sandbox(workspace: Path) -> AsyncIterator[LocalSandbox]:
    sb = LocalSandbox(str(workspace), kill_wait=1.0)
    yield sb
    await sb.aclose()
