"""An MCP server's tool as a dispatcher ``Tool``: the call proxied, the result made a ``ToolOutput``.

Everything around the call (schema check, policy, confirmation, timeout, truncation, audit) is the
pipeline's, as for every tool. What is MCP-specific: cancelling the SDK request (the SDK then sends
``notifications/cancelled``), checking afterwards that the server still answers a ping within the
server's ``cancel_grace_seconds`` (a server stuck in the call is killed, and restarted on the next
one), and turning a dead server into this call's ``execution_error``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import Callable
from typing import Any

import mcp_types
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED

from dispatcher.core.errors import ToolCancelled, ToolExecutionError
from dispatcher.core.text.visible import visible
from dispatcher.core.types import ContentBlock, ImageBlock, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.mcp.connection import McpConnection, McpServerHandle, McpUnavailable

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_MESSAGE_CHARS = 2000
_DEATH_NOTICE_SECONDS = 2.0

HandleFor = Callable[[ToolContext], McpServerHandle]
"""Which running server a call goes to: the one host process, or the calling session's own."""


class McpTool:
    """One call of ``tool`` on an MCP server; a fresh instance per call (the factory is a partial)."""

    def __init__(
        self, definition: ToolDefinition, server: str, tool: str, handle_for: HandleFor, grace: float
    ):
        self.definition = definition
        self._server = server
        self._tool = tool
        self._handle_for = handle_for
        self._grace = grace
        self._call: asyncio.Future[Any] | None = None
        self._conn: McpConnection | None = None
        self._cancelled = False

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        try:
            conn, session = await self._handle_for(context).session()
        except McpUnavailable as exc:
            raise ToolExecutionError(
                f"MCP server {self._server!r} is unavailable: {_clean(str(exc))}"
            ) from exc
        self._conn = conn
        if self._cancelled:
            raise ToolCancelled(f"Tool {self.definition.name!r} was cancelled")
        self._call = asyncio.ensure_future(session.call_tool(self._tool, input))
        try:
            result = await self._call
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise ToolCancelled(f"Tool {self.definition.name!r} was cancelled") from None
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:  # its stdout ended: say why once the connection knows
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_DEATH_NOTICE_SECONDS):
                        await conn.ended.wait()
            raise ToolExecutionError(self._failure(conn, exc), underlying=exc) from exc
        except Exception as exc:  # a result the SDK refused (schema, shape): the server's fault
            raise ToolExecutionError(self._failure(conn, exc), underlying=exc) from exc
        if not isinstance(result, mcp_types.CallToolResult):
            raise ToolExecutionError(f"MCP server {self._server!r} answered with an unexpected result type")
        return to_output(result, self._server, self._tool)

    def _failure(self, conn: McpConnection, exc: BaseException) -> str:
        if conn.ended.is_set() or (conn.process is not None and conn.process.violation):
            reason = conn.process.violation if conn.process is not None and conn.process.violation else None
            return (
                f"MCP server {self._server!r} died during the call ({_clean(reason or conn.end_reason)}); "
                "it is restarted on the next call"
            )
        return f"MCP server {self._server!r} failed the call: {_clean(str(exc))}"

    async def cancel(self) -> bool:
        """Cancel the request (the SDK sends ``notifications/cancelled``), then check the server still
        answers within the grace; if it does not, kill it (it is restarted on the next call)."""
        self._cancelled = True
        call, conn = self._call, self._conn
        if call is None or call.done():
            return False
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await call
        if conn is None or conn.session is None or not conn.alive:
            return True
        try:
            async with asyncio.timeout(self._grace):
                await conn.session.send_ping()
        except Exception:  # TimeoutError, or the connection broke meanwhile
            await conn.kill(f"no answer within {self._grace:g} s after a cancelled call")
        return True


def to_output(result: mcp_types.CallToolResult, server: str, tool: str) -> ToolOutput:
    """Text blocks joined into one, images kept (checked against the byte budget by the pipeline)."""
    texts: list[str] = []
    images: list[ContentBlock] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            texts.append(block.text)
        elif isinstance(block, mcp_types.ImageContent):
            image = _image(block)
            if isinstance(image, str):
                texts.append(image)
            else:
                images.append(image)
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            if isinstance(res, mcp_types.TextResourceContents):
                texts.append(f"[resource {res.uri}]\n{res.text}")
            else:
                texts.append(f"[resource {res.uri}: binary, {res.mime_type or 'unknown type'}, not shown]")
        elif isinstance(block, mcp_types.ResourceLink):
            texts.append(f"[resource link {block.uri}]")
        else:
            texts.append(f"[{getattr(block, 'type', 'unknown')} content, not shown]")
    if not texts and result.structured_content is not None:
        texts.append(json.dumps(result.structured_content, ensure_ascii=False))
    content: list[ContentBlock] = []
    if texts or not images:
        content.append(TextBlock("\n".join(texts)))
    content.extend(images)
    return ToolOutput(
        content=content,
        success=not result.is_error,
        metadata={"mcp_server": server, "mcp_tool": tool},
    )


def _image(block: mcp_types.ImageContent) -> ImageBlock | str:
    if block.mime_type not in IMAGE_TYPES:
        return f"[image of type {_clean(block.mime_type)[:100]}, not shown]"
    try:
        data = base64.b64decode(block.data, validate=True)
    except (binascii.Error, ValueError):
        return "[image with invalid base64 data, not shown]"
    return ImageBlock(data=data, media_type=block.mime_type)


def _clean(text: str) -> str:
    """Untrusted text from a server, made safe to show and bounded."""
    return visible(text[:_MESSAGE_CHARS])
