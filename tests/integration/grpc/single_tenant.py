"""A single-tenant server (no ``tenants:``) on the Docker backend, as a developer runs it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.client import AsyncDispatcherClient
from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.server.app import DispatcherServer, build_server
from tests.integration.conftest import ProviderFactory

Serve = Callable[..., Awaitable[AsyncDispatcherClient]]


@pytest.fixture(name="serve")
async def serve_fixture(make_provider: ProviderFactory, tmp_path: Path) -> AsyncIterator[Serve]:
    """A single-tenant server whose workspace root (``home/workspaces``) is owned by ``owner``."""
    started: list[tuple[DispatcherServer, AsyncDispatcherClient]] = []

    async def start(owner: tuple[int, int], user: str | None = None) -> AsyncDispatcherClient:
        home = tmp_path / "home"
        (home / "workspaces").mkdir(parents=True, exist_ok=True)
        os.chown(home / "workspaces", *owner)
        sandbox: dict[str, Any] = {"backend": "docker", "workspace_quota": None}
        if user is not None:
            sandbox["user"] = user
        data = {
            "home": str(home),
            "sandbox": sandbox,
            "tool_confirmation": {"default": {"EXECUTE": "auto", "WRITE": "auto"}},
        }
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        config, _ = ensure_default_tenant(load_config(path, env={}))
        own = SandboxConfig(user=user) if user else None
        server = build_server(config, provider=lambda hooks: make_provider(own, hooks=hooks))
        await server.start()
        client = AsyncDispatcherClient(f"127.0.0.1:{server.port}", home=str(home))
        started.append((server, client))
        return client

    yield start
    for server, client in started:
        await client.close()
        await server.stop(grace=1)
