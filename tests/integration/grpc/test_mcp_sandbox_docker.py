"""``run: sandbox`` MCP servers on the Docker backend: one process per session, inside its container,
as its sandbox user, without network; cancellation reaches it; it dies with the container and
starts again on the next call (issue 10 point 5)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.server.conftest import base_config, deep_merge
from tests.server.helpers import text_of, until

pytestmark = pytest.mark.docker

SERVER = (Path(__file__).parent / "mcp_stdlib_server.py").read_text()


def _config(tmp_path: Path) -> dict[str, Any]:
    server = {
        "command": "python3",
        "args": ["-c", SERVER],
        "run": "sandbox",
        "cancel_grace_seconds": 2,
        "tools": {"whoami": {"side_effect": "none"}, "touch": {"side_effect": "write"}},
    }
    # No quota volumes: nothing of this test needs them (and nothing is left mounted).
    sandbox = {"backend": "docker", "workspace_quota": None}
    data = deep_merge(base_config(tmp_path), {"sandbox": sandbox, "mcp_servers": {"lab": server}})
    data["tenants"][0]["tool_confirmation"] = {"default": {"WRITE": "auto", "EXECUTE": "auto"}}  # alpha
    return data


async def test_a_sandboxed_mcp_server_runs_in_the_sessions_container(
    make_provider: ProviderFactory, tmp_path: Path
) -> None:
    async with docker_server(make_provider, tmp_path, _config(tmp_path)) as h:
        agent = h.client()
        tools = {t.name for t in await agent.list_tools((await agent.create_session("probe")).session_id)}
        assert {"mcp_lab_whoami", "mcp_lab_touch", "mcp_lab_wait"} <= tools
        one, two = await agent.create_session("one"), await agent.create_session("two")
        who_one = text_of(await agent.call(one.session_id, "mcp_lab_whoami", {}))
        who_two = text_of(await agent.call(two.session_id, "mcp_lab_whoami", {}))
        assert "cwd=/workspace" in who_one and "interfaces=lo" in who_one  # network none
        assert "uid=0 " not in who_one
        assert "cwd=/workspace" in who_two  # its own process, in its own container
        touched = await agent.call(one.session_id, "mcp_lab_touch", {"name": "from-mcp.txt"})
        assert not touched.is_error, text_of(touched)
        workspace = Path(one.workspace_path)
        assert (workspace / "from-mcp.txt").read_text() == "made by the MCP server\n"
        assert not (Path(two.workspace_path) / "from-mcp.txt").exists()

        # Cancellation reaches the process in the container as notifications/cancelled.
        call = asyncio.create_task(agent.call(one.session_id, "mcp_lab_wait", {"tag": "c"}))
        await until(lambda: (workspace / "started-c").exists(), timeout=30)
        await agent.cancel(one.session_id)
        assert str((await asyncio.wait_for(call, 30)).error_class) == "cancelled"
        await until(lambda: (workspace / "cancelled-c").exists())

        # The container goes (the sandbox's processes with it): that call fails, the next works.
        call = asyncio.create_task(agent.call(one.session_id, "mcp_lab_wait", {"tag": "k"}))
        await until(lambda: (workspace / "started-k").exists(), timeout=30)
        sandbox = h.server.provider._sandboxes[one.session_id]  # type: ignore[attr-defined]
        await sandbox.stop_for("test: the container is removed under a running MCP call")
        died = await asyncio.wait_for(call, 30)
        assert str(died.error_class) == "execution_error" and "died during the call" in text_of(died)
        again = await agent.call(one.session_id, "mcp_lab_whoami", {})
        assert not again.is_error and "cwd=/workspace" in text_of(again)
