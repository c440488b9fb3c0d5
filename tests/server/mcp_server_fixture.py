"""A small MCP server written with the official SDK (MCPServer, formerly FastMCP), over stdio.

Run as ``python -m tests.server.mcp_server_fixture``. It leaves marker files in ``$MCP_FIXTURE_DIR``
so tests can see what happened inside it: ``<tag>.started`` (holding its pid) when a slow call
begins and ``<tag>.cancelled`` when the SDK cancelled that call on ``notifications/cancelled``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

# The smallest valid PNG: 1x1, one grey pixel.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010800000000"
    "3a7e9b550000000a49444154789c63600000000200015cc3d6bd0000000049454e44ae426082"
)

server = MCPServer("fixture")
MARKERS = Path(os.environ.get("MCP_FIXTURE_DIR", "."))


def _mark(name: str, text: str = "") -> None:
    (MARKERS / name).write_text(text)


@server.tool(description="Echo the text back, prefixed.\x1b[31m")
def quick(text: str) -> str:
    return f"quick:{text}"


@server.tool(description="Sleep, cooperatively; leaves markers when it starts and when it is cancelled.")
async def slow(seconds: float, tag: str) -> str:
    _mark(f"{tag}.started", str(os.getpid()))
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        _mark(f"{tag}.cancelled")
        raise
    return "slept"


@server.tool(description="Blocks the whole server (its event loop) and so ignores any cancellation.")
async def stuck(seconds: float, tag: str) -> str:
    _mark(f"{tag}.started", str(os.getpid()))
    time.sleep(seconds)
    return "woke"


@server.tool(description="Always fails.")
def broken(message: str) -> str:
    raise ValueError(f"broken: {message}")


@server.tool(description="An optional argument: anyOf in its schema, outside the subset.")
def maybe(count: int | None = None) -> str:
    return str(count)


@server.tool(description="A one-pixel PNG.")
def pixel() -> Image:
    return Image(data=PNG, format="png")


@server.tool(description="A text of that many MiB.")
def huge(mib: int) -> str:
    return "x" * (mib << 20)


@server.tool(description="Its process id.")
def pid() -> str:
    return str(os.getpid())


@server.tool(description="Its process id and working directory.")
def where() -> str:
    return f"{os.getpid()} {os.getcwd()}"


if __name__ == "__main__":
    server.run("stdio")
