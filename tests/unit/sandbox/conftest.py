"""Fixtures: a local agent sandbox over the workspace (workspace and outside: tests/unit/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.sandbox.local import LocalSandbox


@pytest.fixture
async def sandbox(workspace: Path) -> AsyncIterator[LocalSandbox]:
    sb = LocalSandbox(str(workspace), kill_wait=1.0)
    yield sb
    await sb.aclose()
