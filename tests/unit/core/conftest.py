"""Fixtures: a dispatcher over the fake sandbox with the toolkit's tools registered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.core import ConfirmationPolicy, DispatcherConfig, MemoryAuditLog, Session, ToolDispatcher
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.unit.core.toolkit import ALL_TOOLS, StubbornTool


@pytest.fixture
def provider() -> FakeSandboxProvider:
    return FakeSandboxProvider()


@pytest.fixture
def audit() -> MemoryAuditLog:
    return MemoryAuditLog()


@pytest.fixture
def config() -> DispatcherConfig:
    return DispatcherConfig(abandon_after=0.3, confirmation_timeout=2.0)


@pytest.fixture
async def dispatcher(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, config: DispatcherConfig
) -> AsyncIterator[ToolDispatcher]:
    d = ToolDispatcher(provider, config=config, audit=audit, policy=ConfirmationPolicy())
    for factory in ALL_TOOLS:
        d.register(factory)
    yield d
    if StubbornTool.release is not None:
        StubbornTool.release.set()
    await d.aclose()


@pytest.fixture
def session(tmp_path: Any) -> Session:
    return Session(session_id="s1", workspace_path=str(tmp_path), tenant_id="t1")
