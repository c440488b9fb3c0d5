"""One dispatcher session as an MCP server: ``tools/list``, ``tools/call``, resources, prompts.

A ``tools/call`` is one ``Dispatch`` of one tool_use, read as it comes: output deltas go out as
progress notifications, the result as the call's answer. Cancelling the MCP request (the SDK cancels
the handler on ``notifications/cancelled``) closes the Dispatch stream, and the server cancels a
call whose stream is gone: that is the one cancel that stops this call and no other of the session.

A confirmation request is asked as the negotiated protocol revision defines it:

- up to 2025-11-25, ``elicitation/create`` on the request's back-channel, while the stream is still
  read: if another client answers first (``tool.confirmation_resolved``), the question is withdrawn;
- from 2026-07-28, an ``InputRequiredResult`` carrying the elicitation and a ``requestState`` that
  names the call held here (``pending.py``); the client's retry brings the answer and the call goes on.

Either way the answer goes through ``ResolveConfirmation``, so the first answer wins. A client that
did not declare elicitation gets a progress message saying where to answer instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Sequence
from typing import Any, TypeVar, cast

import mcp_types as mt
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from dispatcher.client.aio import AsyncDispatcherClient
from dispatcher.client.base import DispatchItem, RequestFailed, new_id
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import (
    ToolConfirmationRequested,
    ToolConfirmationResolved,
    ToolOutputDelta,
)
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.mcp_server import approval, resources, shapes
from dispatcher.mcp_server.pending import Pending, PendingCalls

log = logging.getLogger("dispatcher.mcp_server")

Ctx = ServerRequestContext[Any, Any]
_T = TypeVar("_T")
SERVER_NAME = "dispatcher"


class SessionBridge:
    """The MCP face of one session, over a gRPC client that carries the caller's token."""

    def __init__(
        self,
        client: AsyncDispatcherClient,
        session_id: str,
        *,
        tools: Sequence[str] | None = None,
        max_pending: int = 16,
    ) -> None:
        self.client = client
        self.session_id = session_id
        self._only = frozenset(tools) if tools else None
        self._pending = PendingCalls(max_pending)

    def server(self) -> Server[Any]:
        """A low-level MCP server whose handlers are this bridge's."""
        return Server(
            SERVER_NAME,
            instructions=(
                f"Tools of dispatcher session {self.session_id}: they run in its sandbox, under its "
                "approval mode; a call that needs approval asks you (elicitation) or waits for it."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_list_prompts=self._list_prompts,
        )

    async def aclose(self) -> None:
        """Cancel the calls still held for a client's retry."""
        await self._pending.aclose()

    # --- tools -----------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Ctx, params: mt.PaginatedRequestParams | None) -> mt.ListToolsResult:
        infos = await self._request(self.client.list_tools(self.session_id))
        return mt.ListToolsResult(
            tools=[shapes.tool(i) for i in infos if self._only is None or i.name in self._only]
        )

    async def _call_tool(
        self, ctx: Ctx, params: mt.CallToolRequestParams
    ) -> mt.CallToolResult | mt.InputRequiredResult:
        if params.request_state is not None:
            held = self._pending.take(params.request_state)
            if held is None:
                raise MCPError(
                    mt.INVALID_PARAMS,
                    "requestState names no call waiting here (expired, answered, or from another "
                    "connection): call the tool again",
                )
            await self._resolve(held, params.input_responses or {})
            return await self._follow(ctx, held)
        if self._only is not None and params.name not in self._only:
            return _error(
                f"Tool {params.name!r} is not offered here (--tools: {', '.join(sorted(self._only))})."
            )
        block = ToolUseBlock(new_id(), params.name, dict(params.arguments or {}))
        # An async generator: closing it cancels the gRPC stream (client/aio.py's ``_stream``).
        items = cast(AsyncGenerator[DispatchItem, None], self.client.dispatch(self.session_id, [block]))
        return await self._follow(ctx, Pending(block.id, items))

    async def _follow(self, ctx: Ctx, call: Pending) -> mt.CallToolResult | mt.InputRequiredResult:
        """Read the call's stream to its result, asking for approvals on the way."""
        asks: dict[str, asyncio.Task[None]] = {}
        parked = False
        try:
            while True:
                try:
                    item: DispatchItem = await anext(call.items)
                except StopAsyncIteration:
                    return _error("The call's stream ended without a result: the session may have closed.")
                except RequestFailed as exc:
                    return _error(f"The dispatcher refused the call: {exc.code}: {exc.details}")
                if isinstance(item, ToolResultBlock):
                    return shapes.result(item)
                step = await self._on_event(ctx, call, item, asks)
                if step is not None:
                    parked = True
                    return step
        finally:
            for task in asks.values():
                task.cancel()
            if not parked:
                # A handler cancelled by notifications/cancelled lands here: closing the stream
                # cancels the call on the server.
                await _close(call.items)

    async def _on_event(
        self, ctx: Ctx, call: Pending, event: Event, asks: dict[str, asyncio.Task[None]]
    ) -> mt.InputRequiredResult | None:
        p = event.payload
        if isinstance(p, ToolOutputDelta):
            call.progress += len(p.text)
            await ctx.session.report_progress(call.progress, None, p.text)
        elif isinstance(p, ToolConfirmationRequested):
            if not _can_elicit(ctx):
                await ctx.session.report_progress(
                    call.progress, None, approval.waiting_note(self.session_id, p)
                )
            elif ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                call.asked[p.request_id] = p
                key = self._pending.park(call)
                request = mt.ElicitRequest(params=approval.question(self.session_id, p))
                return mt.InputRequiredResult(input_requests={p.request_id: request}, request_state=key)
            else:
                asks[p.request_id] = asyncio.create_task(self._ask(ctx, call, p))
        elif isinstance(p, ToolConfirmationResolved):
            task = asks.pop(p.request_id, None)
            if task is not None:  # answered elsewhere first (or timed out): stop asking
                task.cancel()
        return None

    async def _ask(self, ctx: Ctx, call: Pending, p: ToolConfirmationRequested) -> None:
        """Ask on the request's back-channel; the answer goes to ResolveConfirmation."""
        try:
            result = await ctx.session.elicit_form(
                approval.question(self.session_id, p).message,
                approval.SCHEMA,
                related_request_id=ctx.request_id,
            )
        except Exception as exc:  # MCPError, or an answer that is not an ElicitResult
            # The host could not ask (or answered nonsense): the call still waits for another client.
            log.info("elicitation failed for %s: %s", p.request_id, exc)
            await ctx.session.report_progress(call.progress, None, approval.waiting_note(self.session_id, p))
            return
        await self._answer(p.request_id, result)

    async def _resolve(self, call: Pending, responses: dict[str, Any]) -> None:
        for request_id, response in responses.items():
            if request_id not in call.asked:
                continue  # not a question this call asked: ignored, as the spec lets a server do
            if isinstance(response, mt.ElicitResult):
                await self._answer(request_id, response)
        call.asked.clear()

    async def _answer(self, request_id: str, result: mt.ElicitResult) -> None:
        answer = approval.answer(result)
        try:
            await self.client.answer(self.session_id, request_id, answer.decision, remember=answer.remember)
        except RequestFailed as exc:
            # Answered and forgotten already (NOT_FOUND), or the session is gone: the stream says
            # what happened to the call, which is what the MCP client is told.
            log.info("answer to %s not applied: %s", request_id, exc)

    # --- resources and prompts -------------------------------------------------------------------

    async def _list_resources(
        self, ctx: Ctx, params: mt.PaginatedRequestParams | None
    ) -> mt.ListResourcesResult:
        return mt.ListResourcesResult(resources=resources.listed(self.session_id))

    async def _list_templates(
        self, ctx: Ctx, params: mt.PaginatedRequestParams | None
    ) -> mt.ListResourceTemplatesResult:
        return mt.ListResourceTemplatesResult(resource_templates=resources.TEMPLATES)

    async def _read_resource(self, ctx: Ctx, params: mt.ReadResourceRequestParams) -> mt.ReadResourceResult:
        return await self._request(resources.read(self.client, str(params.uri)))

    async def _list_prompts(self, ctx: Ctx, params: mt.PaginatedRequestParams | None) -> mt.ListPromptsResult:
        return mt.ListPromptsResult(prompts=[])

    @staticmethod
    async def _request(work: Awaitable[_T]) -> _T:
        """A gRPC request's failure as an MCP protocol error (the request failed, not a tool)."""
        try:
            result = await work
        except RequestFailed as exc:
            code = mt.INVALID_PARAMS if exc.code in ("NOT_FOUND", "INVALID_ARGUMENT") else mt.INTERNAL_ERROR
            raise MCPError(code, f"{exc.code}: {exc.details}") from None
        return result


def _can_elicit(ctx: Ctx) -> bool:
    caps = ctx.session.client_capabilities
    if caps is None or caps.elicitation is None:
        return False
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or ctx.session.can_send_request


def _error(text: str) -> mt.CallToolResult:
    return mt.CallToolResult(content=[mt.TextContent(type="text", text=text)], is_error=True)


async def _close(items: AsyncGenerator[DispatchItem, None]) -> None:
    with contextlib.suppress(Exception):
        await items.aclose()
