"""``tools/call read_file`` (4 KiB) through the dispatcher as an MCP server, beside the same call over gRPC.

One ``dispatcher serve`` subprocess with ``mcp_endpoint`` on, one session and one workspace file;
three clients take turns on that session: the gRPC client (the baseline of these rows), the MCP
Python SDK's client over stdio to a ``dispatcher mcp --session`` subprocess, and the same client
over the server's streamable HTTP endpoint. Both MCP paths are gateways that make the gRPC call
themselves, so each row's distance from the first is what the gateway and MCP's framing cost.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import mcp_types as mt
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from bench.env import BenchEnv
from bench.grpc_bench import FILE, _check, _docker_answers, _start_server, _stop_server
from bench.table import Row, row, time_async
from dispatcher.client import AsyncDispatcherClient

GROUP = "mcp"
WORKSPACE = "mcp-bench"
WARMUP = 10
REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def _stdio(target: str, token: str, sid: str) -> AsyncIterator[ClientSession]:
    argv = ["-m", "dispatcher.cli", "mcp", "--server", target, "--session", sid]
    env = {**os.environ, "DISPATCHER_TOKEN": token, "PYTHONPATH": str(REPO)}
    params = StdioServerParameters(command=sys.executable, args=argv, env=env)
    with open(os.devnull, "w") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as mcp:
            await mcp.initialize()
            yield mcp


@contextlib.asynccontextmanager
async def _http(url: str, token: str) -> AsyncIterator[ClientSession]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with (
        http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as mcp,
    ):
        await mcp.initialize()
        yield mcp


async def _timed(mcp: ClientSession, n: int) -> list[float]:
    async def call() -> None:
        result = await mcp.call_tool("read_file", {"path": "4k.txt"})
        text = "".join(c.text for c in result.content if isinstance(c, mt.TextContent))
        if result.is_error or "xxxx" not in text:
            raise RuntimeError(f"tools/call read_file failed: {text[:200]}")

    return await time_async(call, n, warmup=WARMUP)


async def measure(env: BenchEnv) -> list[Row]:
    """gRPC, then MCP over stdio, then MCP over streamable HTTP, on one session."""
    backend = "docker" if _docker_answers() else "local"
    where = "" if backend == "docker" else "; local sandbox: no Docker daemon/image"
    token = secrets.token_urlsafe(24)
    port = _free_port()
    extra = {"mcp_endpoint": {"listen": f"127.0.0.1:{port}", "path": "/mcp"}}
    proc, target = _start_server(env, token, backend, extra=extra)
    n = env.warm_iterations
    try:
        async with AsyncDispatcherClient(target, token=token) as client:
            session = await client.create_session(WORKSPACE)
            sid = session.session_id
            Path(session.workspace_path, "4k.txt").write_bytes(FILE)

            async def grpc_call() -> None:
                _check(await client.call(sid, "read_file", {"path": "4k.txt"}))

            grpc = await time_async(grpc_call, n, warmup=WARMUP)
            async with _stdio(target, token, sid) as mcp:
                stdio = await _timed(mcp, n)
            async with _http(f"http://127.0.0.1:{port}/mcp?session={sid}", token) as mcp:
                http = await _timed(mcp, n)
            await client.close_session(sid)
    finally:
        _stop_server(proc)
    return [
        row(GROUP, "read_file 4 KiB via gRPC (the MCP rows' baseline)", grpc, f"grpc.aio client{where}"),
        row(GROUP, "tools/call read_file 4 KiB via MCP stdio", stdio, f"dispatcher mcp --session{where}"),
        row(GROUP, "tools/call read_file 4 KiB via MCP streamable HTTP", http, f"mcp_endpoint{where}"),
    ]
