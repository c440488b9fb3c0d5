"""The key gRPC scenarios with every session in its own hardened Docker container."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

import docker
import pytest

from dispatcher.core.types import ToolUseBlock
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server, unmount_under
from tests.integration.helpers import containers_of
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness, base_config, deep_merge
from tests.server.helpers import text_of
from tests.server.rpc import test_disconnect, test_spec_examples

pytestmark = pytest.mark.docker

Case = Callable[[Harness], Awaitable[None]]


@pytest.mark.parametrize(
    "case",
    [
        test_spec_examples.test_read_a_file,
        test_spec_examples.test_workspace_escape_is_refused,
        test_spec_examples.test_write_denied_by_a_second_client,
        test_spec_examples.test_shell_cancelled_mid_run_keeps_partial_output,
        test_spec_examples.test_three_reads_in_parallel,
        test_spec_examples.test_shell_result_carries_exit_code,
        test_disconnect.test_disconnect_kills_a_running_shell,
    ],
    ids=lambda c: c.__name__.removeprefix("test_"),
)
async def test_scenario_on_docker(docker_harness: Harness, case: Case) -> None:
    await case(docker_harness)


async def test_shell_runs_in_the_container(docker_harness: Harness) -> None:
    client = docker_harness.client()
    session = await client.create_session()
    result = await client.call(
        session.session_id, "shell", {"command": "pwd; id -u; cat /etc/hostname >/dev/null; ls /"}
    )
    assert not result.is_error, result
    lines = text_of(result).splitlines()
    assert lines[0] == "/workspace" and lines[1] != "0"


async def test_close_session_removes_its_container(
    docker_harness: Harness, docker_client: docker.DockerClient
) -> None:
    client = docker_harness.client()
    session = await client.create_session()
    await client.call(session.session_id, "shell", {"command": "true"})
    instance = docker_harness.server.provider.instance  # type: ignore[attr-defined]
    assert len(containers_of(docker_client, instance)) == 1
    await client.close_session(session.session_id)
    assert containers_of(docker_client, instance) == []


async def test_tenants_get_separate_containers_and_workspaces(
    docker_harness: Harness, docker_client: docker.DockerClient
) -> None:
    alpha, beta = docker_harness.client(TOKEN_ALPHA), docker_harness.client(TOKEN_BETA)
    a = await alpha.create_session("same")
    b = await beta.create_session("same")
    await alpha.call(a.session_id, "shell", {"command": "echo secret > alpha.txt"})
    beta_task = asyncio.create_task(beta.call(b.session_id, "read_file", {"path": "alpha.txt"}))
    result = await asyncio.wait_for(beta_task, 30)
    assert result.is_error
    instance = docker_harness.server.provider.instance  # type: ignore[attr-defined]
    tenants = sorted(c.labels.get("dispatcher.tenant") for c in containers_of(docker_client, instance))
    assert tenants == ["alpha", "beta"]  # one container per session, labelled with its tenant


@pytest.mark.parametrize("remove_sessions", [True, False])
async def test_stop_removes_every_container_only_with_remove_sessions(
    make_provider: ProviderFactory,
    tmp_path: Path,
    docker_client: docker.DockerClient,
    remove_sessions: bool,
) -> None:
    data = deep_merge(
        base_config(tmp_path),
        {"sandbox": {"backend": "docker"}, "shutdown": {"remove_sessions": remove_sessions}},
    )
    async with contextlib.AsyncExitStack() as stack:
        # Kept containers keep the quota volumes mounted (for the next start): unmount them here.
        stack.callback(unmount_under, tmp_path)
        harness = await stack.enter_async_context(docker_server(make_provider, tmp_path, data))
        client = harness.client()
        for name in ("one", "two"):
            session = await client.create_session(name)
            items = [
                i
                async for i in client.dispatch(
                    session.session_id, [ToolUseBlock("t", "shell", {"command": "true"})]
                )
            ]
            assert items
        instance = harness.server.provider.instance  # type: ignore[attr-defined]
        assert len(containers_of(docker_client, instance)) == 2
        await harness.server.stop(grace=2)
        # By default the sessions and their containers are kept for the next start.
        assert len(containers_of(docker_client, instance)) == (0 if remove_sessions else 2)
