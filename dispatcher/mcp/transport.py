"""Newline-delimited JSON-RPC over a process's stdin/stdout, as the MCP SDK's stream pair.

The SDK's own ``stdio_client`` reads lines without a bound and hides the process. Here the process
is ours (so a call can kill it when it ignores a cancellation) and every message from it is bounded:
a line longer than ``MAX_MESSAGE_BYTES`` is a protocol violation that ends the process. What an MCP
server sends is untrusted input either way; lines that are not JSON-RPC are dropped.

Parsing a message costs time linear in its size: milliseconds for a large one. A server in a sandbox
is a tenant's program, and one that sent megabyte lines back to back would otherwise hold the event
loop (every tenant's RPCs) for as long as it liked. So a line over ``INLINE_BYTES`` is parsed on a
worker thread, and each process's large lines are paced to ``BIG_BYTES_PER_SECOND``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import anyio
import mcp_types
from mcp.shared.message import SessionMessage

from dispatcher.core.sandbox_api import AttachedProcess

log = logging.getLogger("dispatcher.mcp")

MAX_MESSAGE_BYTES = 16 << 20
"""Longest JSON-RPC line an MCP server on the host may send (a result with images, base64-encoded)."""
SANDBOX_MAX_MESSAGE_BYTES = 8 << 20
"""The same for a server in a sandbox, which a tenant controls: one per session, so kept smaller."""
INLINE_BYTES = 64 << 10
"""A message up to this size is parsed on the event loop (microseconds); a larger one on a thread."""
BIG_BYTES_PER_SECOND = 64 << 20
"""Per process: large messages beyond this rate wait their turn (smaller ones are never delayed)."""


McpProcess = AttachedProcess
"""A running MCP server process (on the host, or in a session's sandbox: ``Sandbox.start_process``)."""


@contextlib.asynccontextmanager
async def message_streams(
    process: McpProcess, name: str, ended: asyncio.Event
) -> AsyncIterator[
    tuple[
        anyio.abc.ObjectReceiveStream[SessionMessage | Exception],
        anyio.abc.ObjectSendStream[SessionMessage],
    ]
]:
    """The (read, write) stream pair an MCP ``ClientSession`` runs on, pumped to and from ``process``.

    ``ended`` is set when the process's stdout ends (it exited, closed it, or broke the protocol).
    """
    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

    async def pump_in() -> None:
        try:
            await read_lines()
        finally:
            ended.set()

    async def read_lines() -> None:
        loop = asyncio.get_running_loop()
        next_big_at = 0.0  # loop time before which the next large message waits
        async with read_send:
            while True:
                try:
                    line = await process.reader.readline()
                except ValueError:  # longer than the reader's limit
                    process.violation = "sent a message longer than its limit (16 MiB, 8 MiB from a sandbox)"
                    log.warning("mcp server %s %s; stopping it", name, process.violation)
                    await process.kill()
                    return
                except ConnectionError:
                    return
                if not line:
                    return
                try:
                    if len(line) <= INLINE_BYTES:
                        message = _parse(line)
                    else:
                        delay = next_big_at - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        message = await asyncio.to_thread(_parse, line)
                        next_big_at = loop.time() + len(line) / BIG_BYTES_PER_SECOND
                except ValueError:
                    log.debug("mcp server %s: dropped a line that is not JSON-RPC", name)
                    continue
                try:
                    await read_send.send(SessionMessage(message))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return

    async def pump_out() -> None:
        try:
            async with write_recv:
                async for item in write_recv:
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    process.writer.write(data.encode("utf-8") + b"\n")
                    await process.writer.drain()
        except (ConnectionError, RuntimeError, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            # The session must see the end instead of a request waiting forever.
            await read_send.aclose()

    tasks = [asyncio.ensure_future(pump_in()), asyncio.ensure_future(pump_out())]
    try:
        yield read_recv, write_send
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for stream in (read_send, read_recv, write_send, write_recv):
            await stream.aclose()


def _parse(line: bytes) -> mcp_types.JSONRPCMessage:
    """One JSON-RPC message of the MCP protocol.

    Raises:
        ValueError: not JSON, or not a JSON-RPC message.
    """
    return mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
