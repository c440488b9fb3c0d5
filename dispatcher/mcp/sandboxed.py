"""``run: sandbox``: an MCP server process inside the calling session's sandbox, one per session.

The process starts on the session's first call of one of the server's tools and runs as the
session's sandbox user in ``/workspace``, under every limit of the container (no network, the
session's grants, pids/memory); it goes when the container goes (session closed, sandbox
recreated or retired) and starts again on the next call. It does not count as work that keeps an
unused container from its idle removal (the agent leaves out sessions ``docker exec`` started). Its tools are listed once at boot, in a
throwaway sandbox of their own (an empty workspace under ``<home>/run/mcp-discovery/<server>``).

The sandbox starts it (``Sandbox.start_process``): with the docker backend the process is attached
over ``docker exec`` (stdin/stdout); with the local backend (tests, development) it is a host process
in the session's workspace directory; a backend that cannot attach one says so.
"""

from __future__ import annotations

import asyncio
import functools
import os
from pathlib import Path

from dispatcher.core.errors import DispatcherError
from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.sandbox_api import Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import ToolContext
from dispatcher.mcp.config import McpServerConfig
from dispatcher.mcp.connection import McpServerHandle
from dispatcher.mcp.transport import SANDBOX_MAX_MESSAGE_BYTES, McpProcess

DISCOVERY_DIR = ("run", "mcp-discovery")


async def spawn_in_sandbox(sandbox: Sandbox, config: McpServerConfig) -> McpProcess:
    """Start the server in ``sandbox``.

    Raises:
        OSError: it could not be started there (the message says why).
    """
    try:
        return await sandbox.start_process(
            config.name, [config.command, *config.args], config.env, limit=SANDBOX_MAX_MESSAGE_BYTES
        )
    except DispatcherError as exc:
        raise OSError(f"in the session's sandbox: {exc}") from exc


class SessionHandles:
    """One handle per session for a ``run: sandbox`` server; handles whose process ended are dropped."""

    def __init__(self, config: McpServerConfig) -> None:
        self._config = config
        self._handles: dict[str, McpServerHandle] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def handle_for(self, context: ToolContext) -> McpServerHandle:
        handle = self._handles.get(context.session_id)
        if handle is None:
            self._drop_ended()
            spawn = functools.partial(spawn_in_sandbox, context.sandbox, self._config)
            handle = McpServerHandle(self._config.name, spawn, self._config.startup_timeout_seconds)
            self._handles[context.session_id] = handle
        return handle

    def _drop_ended(self) -> None:
        # Sessions whose process is gone (their container went with the session, or it died): a
        # later call of theirs makes a new handle. Bounds this map by the live processes.
        for session_id, handle in list(self._handles.items()):
            conn = handle.connection
            if conn is not None and conn.ended.is_set():
                del self._handles[session_id]

    def forget(self, session_id: str) -> None:
        """The session closed: stop its server process now (in the background) and drop its handle."""
        handle = self._handles.pop(session_id, None)
        if handle is not None:
            task = asyncio.get_running_loop().create_task(handle.aclose(), name=f"mcp-close:{session_id}")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            await handle.aclose()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def discovery_session(home: Path, config: McpServerConfig) -> Session:
    """The throwaway session whose sandbox lists a ``run: sandbox`` server's tools at boot."""
    path = home.joinpath(*DISCOVERY_DIR, config.name)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)  # empty; the sandbox user must be able to enter it
    return Session(session_id=f"mcp-discovery-{config.name}", workspace_path=str(path))


def discovery_handle(provider: SandboxProvider, session: Session, config: McpServerConfig) -> McpServerHandle:
    sandbox = provider.sandbox_for(session)
    spawn = functools.partial(spawn_in_sandbox, sandbox, config)
    return McpServerHandle(config.name, spawn, config.startup_timeout_seconds)
