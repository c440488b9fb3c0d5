"""What the tests of a Dispatch caller's own output share (issue 37 item 1): a command printing
3,000,001 known bytes, a client that reads slowly, a watcher's events up to a call's end."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import grpc

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import TOOL_COMPLETED, ToolOutputDelta
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.server.conftest import TOKEN_ALPHA, Harness

LINES = 300_000
COMMAND = f"seq -f '%09.0f' 1 {LINES}; printf x"  # 3,000,001 bytes: numbered lines, then one x
EXPECTED = "".join(f"{i:09d}\n" for i in range(1, LINES + 1)) + "x"
SKIPPED = re.compile(r"\[\.\.\. ([\d,]+) bytes of output skipped")


def small_window_client(harness: Harness) -> AsyncDispatcherClient:
    """A client whose HTTP/2 window stays at its 64 KiB default (no bandwidth probing): what it
    has not read cannot pile up in its transport, as with a slow link or a busy client."""
    channel = grpc.aio.insecure_channel(
        harness.target,
        options=[("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", 64 << 20)],
    )
    client = AsyncDispatcherClient(token=TOKEN_ALPHA, channel=channel, home=str(harness.tmp / "nohome"))
    harness.clients.append(client)
    return client


async def read_slowly(
    client: AsyncDispatcherClient, session_id: str, tid: str, command: str = COMMAND, timeout: float = 300
) -> tuple[str, ToolResultBlock]:
    """The stdout the caller received, in order, and the result; the reader stops for a second at
    its first delta (the command could print all of it meanwhile) and yields to the loop after
    every delta."""
    text: list[str] = []
    result: ToolResultBlock | None = None
    uses = [ToolUseBlock(tid, "shell", {"command": command, "timeout_seconds": timeout})]
    async for item in client.dispatch(session_id, uses):
        if isinstance(item, Event) and isinstance(item.payload, ToolOutputDelta):
            assert item.payload.stream == "stdout"
            text.append(item.payload.text)
            await asyncio.sleep(1.0 if len(text) == 1 else 0.005)  # a deliberately slow reader
        elif isinstance(item, ToolResultBlock):
            result = item
    assert result is not None
    return "".join(text), result


async def watched_until(
    events: AsyncIterator[Event], tid: str, ends: tuple[str, ...] = (TOOL_COMPLETED,)
) -> list[Event]:
    """A watcher's events up to ``tid``'s first event of a type in ``ends``."""
    seen: list[Event] = []
    async for event in events:
        seen.append(event)
        if event.tool_use_id == tid and event.type in ends:
            return seen
    raise AssertionError(f"the watch ended before {tid} ended")
