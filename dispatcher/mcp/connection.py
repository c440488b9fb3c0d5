"""One MCP server process with its client session, restarted on the next use once it is gone.

The SDK's ``ClientSession`` lives in an anyio task group that must be entered and left by one
task, so each running server gets a small task of its own that holds the session open until the
process exits or the server is closed; calls use the session from their own tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from mcp import ClientSession
from mcp.types import Implementation

from dispatcher.mcp.transport import McpProcess, message_streams

log = logging.getLogger("dispatcher.mcp")

CLIENT_INFO = Implementation(name="dispatcher", version="0.1.0")
Spawn = Callable[[], Awaitable[McpProcess]]


class McpUnavailable(Exception):
    """The MCP server could not be started or initialised (the message says why)."""


class McpConnection:
    """A started MCP server process and the initialised session on it."""

    def __init__(self, name: str, spawn: Spawn) -> None:
        self.name = name
        self._spawn = spawn
        self.process: McpProcess | None = None
        self.session: ClientSession | None = None
        self._ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()
        self.end_reason = ""
        self._eof = asyncio.Event()

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.ended.is_set()

    async def start(self, timeout: float) -> ClientSession:
        """Spawn, initialise, and return the session.

        Raises:
            McpUnavailable: it did not start, or did not answer ``initialize`` within ``timeout``.
        """
        self._task = asyncio.ensure_future(self._run())
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self._ready)
        except TimeoutError:
            await self.close()
            raise McpUnavailable(f"no answer to initialize within {timeout:g} s{self._stderr()}") from None
        except McpUnavailable:
            await self.close()
            raise
        except asyncio.CancelledError:
            await self.close()
            raise

    def _stderr(self) -> str:
        tail = self.process.stderr_tail() if self.process is not None else ""
        return f" (stderr: {tail})" if tail else ""

    async def _run(self) -> None:
        try:
            try:
                self.process = await self._spawn()
            except (OSError, ValueError) as exc:
                raise McpUnavailable(f"cannot start: {exc}") from exc
            async with (
                message_streams(self.process, self.name, self._eof) as (read, write),
                ClientSession(read, write, client_info=CLIENT_INFO) as session,
            ):
                try:
                    await session.initialize()
                except Exception as exc:
                    detail = self.process.violation or str(exc)[:500]
                    raise McpUnavailable(f"initialize failed: {detail}{self._stderr()}") from exc
                self.session = session
                self._ready.set_result(session)
                waits = [
                    asyncio.ensure_future(self.process.wait()),
                    asyncio.ensure_future(self._stop.wait()),
                    asyncio.ensure_future(self._eof.wait()),
                ]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiting in waits:
                        waiting.cancel()
                if not self._stop.is_set():
                    self.end_reason = self.process.violation or f"the process exited{self._stderr()}"
                    self.ended.set()  # before the session is torn down: its calls fail next
                    log.warning("mcp server %s ended: %s", self.name, self.end_reason)
        except McpUnavailable as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)
        except Exception as exc:
            log.warning("mcp server %s failed: %r", self.name, exc)
            if not self._ready.done():
                self._ready.set_exception(McpUnavailable(f"{exc!r}"[:500] + self._stderr()))
        finally:
            if not self.end_reason:
                self.end_reason = "stopped"
            self.ended.set()
            if self.process is not None:
                await self.process.close()
            if not self._ready.done():
                self._ready.set_exception(McpUnavailable("stopped before it was ready"))

    async def kill(self, reason: str) -> None:
        """End the process now (a call it would not give up); the session ends with it."""
        if not self.end_reason:
            self.end_reason = reason
        log.warning("mcp server %s: killing it: %s", self.name, reason)
        if self.process is not None:
            await self.process.kill()
        await self._finish()

    async def close(self) -> None:
        """Stop the server politely (stdin closed, then killed)."""
        self._stop.set()
        await self._finish()

    async def _finish(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        # A ready future nobody awaited must not warn at garbage collection.
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()


class McpServerHandle:
    """The one place a server's tools get their session from: (re)started on demand, one at a time."""

    def __init__(self, name: str, spawn: Spawn, startup_timeout: float) -> None:
        self.name = name
        self._spawn = spawn
        self._startup_timeout = startup_timeout
        self._lock = asyncio.Lock()
        self._conn: McpConnection | None = None
        self._closed = False

    @property
    def connection(self) -> McpConnection | None:
        return self._conn

    async def session(self) -> tuple[McpConnection, ClientSession]:
        """The live connection and its session, starting the server if none runs.

        Raises:
            McpUnavailable: it cannot be started (the message says why).
        """
        async with self._lock:
            if self._closed:
                raise McpUnavailable("the server is shutting down")
            conn = self._conn
            if conn is not None and conn.alive and conn.session is not None:
                return conn, conn.session
            if conn is not None:
                await conn.close()
                log.info("mcp server %s: restarting (%s)", self.name, conn.end_reason)
            conn = self._conn = McpConnection(self.name, self._spawn)
            return conn, await conn.start(self._startup_timeout)

    async def aclose(self) -> None:
        async with self._lock:
            self._closed = True
            if self._conn is not None:
                await self._conn.close()
