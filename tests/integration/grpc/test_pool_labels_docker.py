"""A session that adopts a warm pool's container is found by its labels like any other: the pooled
container was made for the session id the server then gave that session, and for its tenant."""

from __future__ import annotations

import os
from typing import Any

import docker
import pytest

from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_POOL, LABEL_SESSION, LABEL_TENANT
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from tests.integration.grpc.conftest import Start
from tests.polling import until
from tests.server.conftest import TOKEN_BETA

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(os.geteuid() != 0, reason="the warm pool mounts workspaces: root only"),
]


def _of_session(client: docker.DockerClient, session_id: str) -> list[Any]:
    return list(
        client.containers.list(
            all=True, filters={"label": f"{LABEL_SESSION}={session_id}"}, ignore_removed=True
        )
    )


async def _ready(provider: DockerSandboxProvider, n: int) -> None:
    await until(lambda: provider.pool.ready >= n, f"the pool to fill to {n}", timeout=60, interval=0.05)


async def test_a_pooled_sessions_container_carries_its_session_and_tenant(
    start: Start, docker_client: docker.DockerClient
) -> None:
    harness = await start({"warm_pool": {"size": 2}})
    provider = harness.server.provider
    assert isinstance(provider, DockerSandboxProvider)
    await _ready(provider, 2)  # shared by the configured tenants before anyone asks
    alpha, beta = harness.client(), harness.client(TOKEN_BETA)

    a = await alpha.create_session("a")
    b = await beta.create_session("b")
    for client, session in ((alpha, a), (beta, b)):
        result = await client.call(session.session_id, "list_dir", {})  # runs in its container
        assert not result.is_error, result

    assert provider.pool.hits == 2 and provider.pool.misses == 0
    for session, tenant in ((a, "alpha"), (b, "beta")):
        [container] = _of_session(docker_client, session.session_id)
        assert container.status == "running"
        assert container.labels[LABEL_TENANT] == tenant
        assert container.labels[LABEL_INSTANCE] == provider.instance
        assert container.labels[LABEL_POOL] == "1"  # it came from the pool
    await alpha.close_session(a.session_id)
    assert _of_session(docker_client, a.session_id) == []


async def test_a_session_closed_before_its_pooled_container_started_leaves_none(
    start: Start, docker_client: docker.DockerClient
) -> None:
    harness = await start({"warm_pool": {"size": 1}, "start_on_create": True})
    provider = harness.server.provider
    assert isinstance(provider, DockerSandboxProvider)
    await _ready(provider, 1)
    client = harness.client()

    session = await client.create_session("short")
    await client.close_session(session.session_id)

    assert _of_session(docker_client, session.session_id) == []
    await _ready(provider, 1)  # refilled, for a new id
    [waiting] = [
        c
        for c in docker_client.containers.list(
            filters={"label": f"{LABEL_INSTANCE}={provider.instance}"}, ignore_removed=True
        )
        if c.labels.get(LABEL_POOL)
    ]
    assert waiting.labels[LABEL_SESSION] != session.session_id
