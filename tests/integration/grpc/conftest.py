"""The gRPC server on the real Docker backend (marker ``docker``).

Reuses the parent conftest's ``make_provider`` (unique instance label per provider, every container
removed in teardown even on failure) and the server tests' configuration, so the same test bodies
run against both backends.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.core.provider_api import ProviderHooks
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.server.app import build_server
from tests.integration.conftest import ProviderFactory
from tests.integration.helpers import runsc_available
from tests.server.conftest import Harness, base_config, deep_merge

Start = Callable[..., Awaitable[Harness]]


@contextlib.asynccontextmanager
async def docker_server(
    make_provider: ProviderFactory, tmp_path: Path, data: dict[str, Any] | None = None
) -> AsyncIterator[Harness]:
    """A started server on the Docker backend for the server tests' config (or ``data``)."""
    if data is None:
        data = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    config, _ = ensure_default_tenant(load_config(path, env={}))
    server = build_server(config, provider=lambda hooks: make_provider(hooks=hooks))
    await server.start()
    harness = Harness(server, tmp_path)
    try:
        yield harness
    finally:
        for client in harness.clients:
            await client.close()
        await server.stop(grace=1)


@pytest.fixture
async def docker_harness(make_provider: ProviderFactory, tmp_path: Path) -> AsyncIterator[Harness]:
    """A started server whose sessions run in Docker containers."""
    async with docker_server(make_provider, tmp_path) as harness:
        yield harness


def unmount_under(path: Path) -> list[str]:
    """Detach every mount below ``path`` (a safety net: the server unmounts what it mounted)."""
    left: list[str] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            point = line.split()[4]
            if point == str(path) or point.startswith(f"{path}/"):
                left.append(point)
    for point in sorted(left, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)
    return left


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> str:
    if request.param == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    return str(request.param)


@pytest.fixture
async def start(make_provider: ProviderFactory, tmp_path: Path) -> AsyncIterator[Start]:
    """Start a Docker-backed server whose provider keeps quota images under its home."""
    harnesses: list[Harness] = []

    async def go(sandbox: dict[str, Any] | None = None, **overrides: Any) -> Harness:
        section = {"workspace_quota": "64m", **(sandbox or {})}
        data = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker", **section}, **overrides})
        path = tmp_path / f"config-{len(harnesses)}.yaml"
        path.write_text(yaml.safe_dump(data))
        config, _ = ensure_default_tenant(load_config(path, env={}))

        def provider(hooks: ProviderHooks) -> DockerSandboxProvider:
            made = DockerSandboxProvider(
                SandboxConfig.from_mapping(section),
                instance=make_provider.new_instance(),
                state_dir=str(config.home),
                hooks=hooks,
            )
            make_provider.providers.append(made)
            return made

        server = build_server(config, provider=provider)
        harness = Harness(server, tmp_path)
        harnesses.append(harness)
        await server.start()
        return harness

    try:
        yield go
    finally:
        for h in harnesses:
            for client in h.clients:
                await client.close()
            await h.server.stop(grace=1)
        leaked = unmount_under(tmp_path)
        assert not leaked, f"the server left mounts behind: {leaked}"
