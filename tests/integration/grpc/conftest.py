"""The gRPC server on the real Docker backend (marker ``docker``).

Reuses the parent conftest's ``make_provider`` (unique instance label per provider, every container
removed in teardown even on failure) and the server tests' configuration, so the same test bodies
run against both backends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import ensure_default_tenant, load_config
from dispatcher.server.app import build_server
from tests.integration.conftest import ProviderFactory
from tests.server.conftest import Harness, base_config, deep_merge


@pytest.fixture
async def docker_harness(make_provider: ProviderFactory, tmp_path: Path) -> AsyncIterator[Harness]:
    """A started server whose sessions run in Docker containers."""
    data: dict[str, Any] = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    config, _ = ensure_default_tenant(load_config(path, env={}))
    provider = make_provider()
    server = build_server(config, provider=provider)
    await server.start()
    harness = Harness(server, tmp_path)
    try:
        yield harness
    finally:
        for client in harness.clients:
            await client.close()
        await server.stop(grace=1)
