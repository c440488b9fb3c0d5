"""Fixtures for tests against the real Docker daemon (marker ``docker``).

Every provider made here carries an instance label unique to this pytest run; each provider's
teardown removes its containers, and a session finalizer sweeps anything else with this run's
labels, so ``docker ps -a --filter label=dispatcher.session`` is empty afterwards even when a test
failed half-way. With ``DISPATCHER_REQUIRE_DOCKER=1`` (CI) a missing daemon or image fails loudly;
otherwise those tests are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import pytest

from dispatcher.core.provider_api import NO_HOOKS, ProviderHooks
from dispatcher.core.sandbox_api import Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import DEFAULT_IMAGE, SandboxConfig, WarmPoolConfig
from dispatcher.sandbox.container.labels import LABEL_INSTANCE
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from tests.integration.helpers import containers_of

RUN_ID = uuid.uuid4().hex[:8]
INSTANCE_PREFIX = f"pytest-{RUN_ID}"
BUSYBOX_IMAGE = "dispatcher-busybox:latest"
DEFAULT_TENANT = "tenant-a"
SANDBOX_IDS = (1000, 1000)
"""The default ``sandbox.user``: the owner of the workspaces tests make by hand."""
_counter = itertools.count()
WARM_POOL_ENV = "DISPATCHER_TEST_WARM_POOL"
"""Set to N: every provider made here keeps a warm pool of N, so the isolation tests run with
sessions adopting pooled containers (those the pool may serve) as well as launching their own."""


def _require_docker() -> bool:
    return os.environ.get("DISPATCHER_REQUIRE_DOCKER") == "1"


def _unavailable(reason: str) -> None:
    if _require_docker():
        pytest.fail(f"DISPATCHER_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A daemon that answers and the default sandbox image, or a skip (a failure in CI)."""
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:
        _unavailable(f"no Docker daemon answers ({type(exc).__name__}: {exc})")
        raise  # unreachable: _unavailable always raises
    try:
        client.images.get(DEFAULT_IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        _unavailable(f"sandbox image {DEFAULT_IMAGE} is missing (run `make images`)")
    yield client
    _sweep(client)
    client.close()


def _sweep(client: docker.DockerClient) -> None:
    """Force-remove every container any provider of this run labelled."""
    for container in client.containers.list(all=True, filters={"label": LABEL_INSTANCE}, ignore_removed=True):
        if container.labels.get(LABEL_INSTANCE, "").startswith(INSTANCE_PREFIX):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True)


@dataclass
class ProviderFactory:
    """Makes providers with unique instance labels and removes all their containers afterwards."""

    client: docker.DockerClient
    workspaces: Path
    providers: list[DockerSandboxProvider] = field(default_factory=list)

    def new_instance(self) -> str:
        return f"{INSTANCE_PREFIX}-{next(_counter)}"

    def __call__(
        self,
        config: SandboxConfig | None = None,
        *,
        instance: str | None = None,
        hooks: ProviderHooks = NO_HOOKS,
    ) -> DockerSandboxProvider:
        config = config or SandboxConfig()
        pool = int(os.environ.get(WARM_POOL_ENV) or 0)
        if pool and "warm_pool" not in config.model_fields_set:
            config = config.model_copy(update={"warm_pool": WarmPoolConfig(size=pool)})
        provider = DockerSandboxProvider(config, instance=instance or self.new_instance(), hooks=hooks)
        self.providers.append(provider)
        if pool:
            provider.pool.expect_tenants({DEFAULT_TENANT: (None, None)})
            if instance is None:  # else a restarted server's: its start-up sweep starts the pool
                with contextlib.suppress(RuntimeError):  # made outside a loop: no pool for it
                    provider.pool.start()
        return provider

    def session(self, name: str = "s", *, tenant: str = DEFAULT_TENANT) -> Session:
        """A new session; named, as the session manager names one, after a container the latest
        provider's warm pool made for it, when it has one (a pooled container carries its
        session's label from the start, so only the session with that id adopts it)."""
        session_id = f"{name}-{uuid.uuid4().hex[:8]}"
        workspace = self.workspaces / session_id
        workspace.mkdir(parents=True)
        # A developer's workspace belongs to the sandbox user (1000); the server re-owns nothing.
        os.chown(workspace, SANDBOX_IDS[0], SANDBOX_IDS[1])
        session = Session(session_id=session_id, workspace_path=str(workspace), tenant_id=tenant)
        pooled = [p for p in self.providers if p.pool.size > 0]
        if pooled and (reserved := pooled[-1].reserve_session_id(session)) is not None:
            return dataclasses.replace(session, session_id=reserved)
        return session

    async def cleanup(self) -> None:
        for provider in self.providers:
            with contextlib.suppress(Exception):
                await provider.aclose()
            for container in containers_of(self.client, provider.instance):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True)
                # Removed behind the provider's back (kept for a restart that never came).
                provider.launcher.sockets.forget(container.id)
            provider.launcher.sockets.sweep()  # as the next start would
            provider.launcher.sockets.close()
            with contextlib.suppress(OSError):  # the instance's directory, once empty
                os.rmdir(os.path.dirname(provider.launcher.sockets.root))


@pytest.fixture
async def make_provider(docker_client: docker.DockerClient, tmp_path: Path) -> AsyncIterator[ProviderFactory]:
    factory = ProviderFactory(docker_client, tmp_path / "workspaces")
    try:
        yield factory
    finally:
        await factory.cleanup()


@pytest.fixture
async def provider(make_provider: ProviderFactory) -> DockerSandboxProvider:
    """A provider with the default (hardened) configuration."""
    return make_provider()


@pytest.fixture
def session(make_provider: ProviderFactory) -> Session:
    return make_provider.session()


@pytest.fixture
def sandbox(provider: DockerSandboxProvider, session: Session) -> Sandbox:
    return provider.sandbox_for(session)
