"""``sandbox.start_on_create``: CreateSession starts the session's container in the background, so
the model's first call finds it running; CloseSession right after leaves nothing behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import docker
import pytest
import yaml

from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.labels import LABEL_SESSION
from dispatcher.server.app import build_server
from tests.integration.conftest import ProviderFactory
from tests.polling import until
from tests.server.conftest import Harness, base_config, deep_merge
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker


def _running(client: docker.DockerClient, session_id: str) -> list[str]:
    found = client.containers.list(filters={"label": f"{LABEL_SESSION}={session_id}"}, ignore_removed=True)
    return [c.id for c in found if c.status == "running"]


async def test_a_new_sessions_container_is_up_before_its_first_call(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker", "start_on_create": True}})
        )
    )
    config, _ = ensure_default_tenant(load_config(path, env={}))
    assert config.sandbox.start_on_create  # what the file says reaches the docker backend's config
    sandbox = SandboxConfig(start_on_create=True)
    server = build_server(config, provider=lambda hooks: make_provider(sandbox, hooks=hooks))
    await server.start()
    harness = Harness(server, tmp_path)
    try:
        client = harness.client()
        session = await client.create_session("warm")
        # No call made yet: a container was started at creation.
        await until(
            lambda: bool(_running(docker_client, session.session_id)),
            "a container started at creation",
            timeout=30,
            interval=0.05,
        )
        up = _running(docker_client, session.session_id)
        result = await client.call(session.session_id, "shell", {"command": "echo ready"})
        assert not result.is_error and "ready" in text_of(result)
        assert _running(docker_client, session.session_id) == up  # the call found it: no launch of its own
        gone = await client.create_session("gone")
        await client.close_session(gone.session_id)
        await asyncio.sleep(1)
        assert not _running(docker_client, gone.session_id)
    finally:
        for opened in harness.clients:
            await opened.close()
        await server.stop(grace=1)
