"""The configured MCP servers: started at boot, their tools listed and registered before the seal.

A server that cannot be started, initialised or listed at boot is a configuration error naming
``mcp_servers.<name>``: ``dispatcher serve`` exits 2 rather than serve a tool set other than the
one configured. A tool whose name or input schema the registry cannot take is skipped with a
warning naming it; names and descriptions from a server are untrusted (bounded, escaped).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher.core.dispatcher import ToolDispatcher
from dispatcher.core.errors import ConfigError, ToolRegistrationError
from dispatcher.core.jsonlimits import shape_problem
from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.schema import check_schema
from dispatcher.core.sessions.registry import BaseSessionListener
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.text.visible import visible
from dispatcher.core.types import ToolContext, ToolDefinition
from dispatcher.mcp.config import MAX_TOOL_NAME, McpServerConfig

if TYPE_CHECKING:  # the SDK is imported only when a server is configured (it costs ~0.7 s)
    import mcp_types

    from dispatcher.mcp.connection import McpServerHandle
    from dispatcher.mcp.sandboxed import SessionHandles
    from dispatcher.mcp.tool import HandleFor
    from dispatcher.mcp.transport import McpProcess

log = logging.getLogger("dispatcher.mcp")

MAX_DESCRIPTION_CHARS = 4096
MAX_TOOLS_PER_SERVER = 512
MAX_LIST_PAGES = 32
MAX_SCHEMA_CHARS = 64 << 10
_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


class McpServers(BaseSessionListener):
    """Every configured server's handle, and the registration of their tools; a listener of the
    session registry (a closed session's ``run: sandbox`` processes go with it)."""

    def __init__(
        self,
        servers: Sequence[McpServerConfig],
        *,
        provider: SandboxProvider | None = None,
        home: Path | None = None,
    ) -> None:
        self._configs = tuple(servers)
        self._provider = provider
        self._home = home
        self._handles: dict[str, McpServerHandle] = {}
        self._per_session: dict[str, SessionHandles] = {}

    def __bool__(self) -> bool:
        return bool(self._configs)

    def handle(self, name: str) -> McpServerHandle | None:
        return self._handles.get(name)

    async def register(self, dispatcher: ToolDispatcher) -> None:
        """Start each server, list its tools and register them.

        Raises:
            ConfigError: naming ``mcp_servers.<name>``: it did not start or list, or one of its
                tools' names collides with another tool.
        """
        try:
            for config in self._configs:
                await self._register_server(config, dispatcher)
        except BaseException:
            await self.aclose()
            raise

    async def _register_server(self, config: McpServerConfig, dispatcher: ToolDispatcher) -> None:
        from dispatcher.mcp.connection import McpServerHandle
        from dispatcher.mcp.sandboxed import SessionHandles
        from dispatcher.mcp.tool import McpTool

        handle_for: HandleFor
        if config.run == "host":
            handle = McpServerHandle(
                config.name, functools.partial(_spawn_host, config), config.startup_timeout_seconds
            )
            self._handles[config.name] = handle
            tools = await _list(config, handle)
            handle_for = _fixed(handle)
        else:
            tools = await self._discover_in_sandbox(config)
            sessions = self._per_session[config.name] = SessionHandles(config)
            handle_for = sessions.handle_for
        registered: list[str] = []
        for tool in tools:
            definition = _definition(config, tool)
            if definition is None:
                continue
            factory = functools.partial(
                McpTool, definition, config.name, tool.name, handle_for, config.cancel_grace_seconds
            )
            try:
                dispatcher.register(factory)
            except ToolRegistrationError as exc:
                raise ConfigError(f"{config.where}: tool {tool.name!r}: {exc}") from None
            registered.append(definition.name)
        offered = {t.name for t in tools}
        for name in sorted(set(config.tools) - offered):
            log.warning("%s.tools.%s: the server offers no such tool", config.where, name)
        log.info(
            "mcp server %s: registered %d tools", config.name, len(registered), extra={"tools": registered}
        )

    async def _discover_in_sandbox(self, config: McpServerConfig) -> list[mcp_types.Tool]:
        """List a ``run: sandbox`` server's tools in a throwaway sandbox, removed afterwards."""
        from dispatcher.mcp.sandboxed import discovery_handle, discovery_session

        if self._provider is None or self._home is None:
            raise ConfigError(f"{config.where}.run: 'sandbox' needs a sandbox provider")
        session = discovery_session(self._home, config)
        handle = discovery_handle(self._provider, session, config)
        try:
            return await _list(config, handle, where="in a sandbox")
        finally:
            await handle.aclose()
            await self._provider.close_session(session.session_id)

    def session_closed(self, state: SessionState) -> None:
        for handles in self._per_session.values():
            handles.forget(state.session.session_id)

    async def aclose(self) -> None:
        """Stop every server process."""
        handles, self._handles = list(self._handles.values()), {}
        per_session, self._per_session = list(self._per_session.values()), {}
        await asyncio.gather(
            *(h.aclose() for h in handles), *(s.aclose() for s in per_session), return_exceptions=True
        )


async def _list(config: McpServerConfig, handle: McpServerHandle, where: str = "") -> list[mcp_types.Tool]:
    """Start the server on ``handle`` and list its tools.

    Raises:
        ConfigError: naming ``mcp_servers.<name>``.
    """
    from dispatcher.mcp.connection import McpUnavailable

    at = f" {where}" if where else ""
    try:
        _, session = await handle.session()
        async with asyncio.timeout(config.startup_timeout_seconds):
            return await _list_tools(session)
    except McpUnavailable as exc:
        raise ConfigError(f"{config.where}: cannot start the MCP server{at}: {exc}") from None
    except TimeoutError:
        raise ConfigError(
            f"{config.where}: no tools/list answer within {config.startup_timeout_seconds:g} s"
        ) from None
    except Exception as exc:
        raise ConfigError(f"{config.where}: tools/list failed: {visible(str(exc)[:500])}") from None


async def _spawn_host(config: McpServerConfig) -> McpProcess:
    from dispatcher.mcp.transport import MAX_MESSAGE_BYTES
    from dispatcher.sandbox.host_process import HostProcess

    return await HostProcess.start(
        config.name, config.command, config.args, config.env, limit=MAX_MESSAGE_BYTES
    )


def _fixed(handle: McpServerHandle) -> HandleFor:
    def handle_for(context: ToolContext) -> McpServerHandle:
        return handle

    return handle_for


async def _list_tools(session: Any) -> list[mcp_types.Tool]:
    import mcp_types

    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor or len(tools) >= MAX_TOOLS_PER_SERVER:
            break
    if len(tools) > MAX_TOOLS_PER_SERVER:
        log.warning("mcp server offers more than %d tools; the rest are ignored", MAX_TOOLS_PER_SERVER)
    return tools[:MAX_TOOLS_PER_SERVER]


def _definition(config: McpServerConfig, tool: mcp_types.Tool) -> ToolDefinition | None:
    """The dispatcher's definition of ``tool``, or None (with a warning naming it) to skip it."""
    shown = visible(str(tool.name)[:MAX_TOOL_NAME], escape_backslash=True)
    if not isinstance(tool.name, str) or not _TOOL_NAME_RE.match(tool.name):
        log.warning(
            "%s: skipping tool %r: the name must match %s", config.where, shown, _TOOL_NAME_RE.pattern
        )
        return None
    name = config.tool_name(tool.name)
    if len(name) > MAX_TOOL_NAME:
        log.warning("%s: skipping tool %r: %s is longer than %d", config.where, shown, name, MAX_TOOL_NAME)
        return None
    schema = tool.input_schema
    problem = shape_problem(schema)
    if problem is None and len(repr(schema)) > MAX_SCHEMA_CHARS:
        problem = f"larger than {MAX_SCHEMA_CHARS} characters"
    if problem is None:
        try:
            check_schema(name, schema)
        except ToolRegistrationError as exc:
            problem = str(exc)
    if problem is not None:
        log.warning(
            "%s: skipping tool %s: its input schema is outside the supported subset: %s",
            config.where,
            name,
            visible(problem[:1000]),
        )
        return None
    description = visible((tool.description or "")[:MAX_DESCRIPTION_CHARS], keep_newlines=True)
    return ToolDefinition(
        name=name,
        description=f"[MCP server {config.name}] {description}".rstrip(),
        input_schema=schema,
        side_effect=config.side_effect_of(tool.name),
        timeout_seconds=config.timeout_seconds,
        always_prompt=config.always_prompt_of(tool.name),
    )
