"""Waiting helpers: on events or by polling with a deadline, never fixed sleeps."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.events.bus import EventPayload
from dispatcher.core.types import TextBlock, ToolResultBlock
from tests.events import EventOf, is_event
from tests.polling import until

__all__ = ["next_event", "text_of", "until"]

P = TypeVar("P", bound=EventPayload)


async def next_event(
    client: AsyncDispatcherClient,
    session_id: str,
    kind: type[P],
    *,
    after_seq: int = 0,
    timeout: float = 20.0,
) -> EventOf[P]:
    """The first event with a ``kind`` payload in the session after ``after_seq`` (replayed or live)."""

    async def find() -> EventOf[P]:
        async for event in client.watch(session_id, after_seq=after_seq):
            if is_event(event, kind):
                return event
        raise AssertionError(f"session closed before a {kind.__name__} event")

    return await asyncio.wait_for(find(), timeout)


def text_of(result: ToolResultBlock) -> str:
    """The text of ``result``: its text blocks, joined."""
    return "".join(block.text for block in result.content if isinstance(block, TextBlock))
