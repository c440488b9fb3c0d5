"""The official TypeScript SDK's MCP client (``examples/node/mcp_client.js``) against the dispatcher
as an MCP server, over ``dispatcher mcp`` (stdio) and over the server's HTTP endpoint, with a real
Docker sandbox: tools, shell and read_file, a write approved and one declined through elicitation,
a cancelled call that leaves no process (issue 36)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.mcp_host import REPO, mcp_argv
from tests.node_example import EXAMPLE, node_with_deps
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, base_config, deep_merge

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_the_typescript_sdk_client(
    make_provider: ProviderFactory, tmp_path: Path, transport: str
) -> None:
    node = node_with_deps()
    data = deep_merge(
        base_config(tmp_path),
        {"sandbox": {"backend": "docker"}, "mcp_endpoint": {"listen": "127.0.0.1:0", "path": "/mcp"}},
    )
    async with docker_server(make_provider, tmp_path, data) as harness:
        assert harness.server.mcp_endpoint is not None
        env = {
            **os.environ,
            "DISPATCHER_TOKEN": TOKEN_ALPHA,
            "PYTHONPATH": str(REPO),
            "MCP_TRANSPORT": transport,
            "MCP_COMMAND": json.dumps([sys.executable, *mcp_argv(harness.target, "--mode", "cautious")]),
            "MCP_URL": f"http://127.0.0.1:{harness.server.mcp_endpoint.port}/mcp?mode=cautious",
        }
        with anyio.fail_after(120):
            run = await anyio.run_process([node, str(EXAMPLE / "mcp_client.js")], env=env, check=False)
        stdout, stderr = run.stdout.decode(), run.stderr.decode()
        assert run.returncode == 0, stdout + stderr
        assert "write_file approved, read_file read it back" in stdout
        assert "write_file declined: User denied this operation." in stdout
        assert "cancelled call: no process left" in stdout
        assert stdout.splitlines()[-1] == "OK"
        ws = tmp_path / "ws-alpha" / "default"
        assert (ws / "ts.txt").read_text() == "from ts\n" and not (ws / "no.txt").exists()
        # The session the client's MCP session made is closed once it ended (stdin closed, DELETE).
        client = harness.client()

        async def closed() -> bool:
            return not await client.list_sessions()

        await until(closed, "the MCP session's dispatcher session to close", timeout=30)
