"""Metrics on the real Docker backend: a sandbox launch is timed, the call counted, and a removal
counted by why."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.server.conftest import base_config, deep_merge
from tests.server.observability.test_metrics import samples, scrape

pytestmark = pytest.mark.docker


async def test_sandbox_launches_and_calls_are_counted(make_provider: ProviderFactory, tmp_path: Path) -> None:
    data = deep_merge(
        base_config(tmp_path), {"sandbox": {"backend": "docker"}, "metrics": {"listen": "127.0.0.1:0"}}
    )
    async with docker_server(make_provider, tmp_path, data) as harness:
        client = harness.client()
        session = await client.create_session("metrics")
        assert not (await client.call(session.session_id, "shell", {"command": "true"})).is_error
        sandbox = harness.server.provider._sandboxes[session.session_id]  # type: ignore[attr-defined]
        assert await sandbox.retire_if_idle(time.monotonic() + 10_000, ttl=600)
        text = await asyncio.to_thread(scrape, harness.server.observability.metrics_port)
    assert samples(text, "dispatcher_sandbox_launch_seconds_count") == {"": 1.0}
    assert samples(text, "dispatcher_tool_calls_total") == {'{outcome="ok",tool="shell"}': 1.0}
    assert samples(text, "dispatcher_sandbox_failures_total") == {}  # no launch failed
    assert samples(text, "dispatcher_sandbox_removals_total") == {'{reason="idle"}': 1.0}
