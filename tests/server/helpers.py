"""Waiting helpers: on events or by polling with a deadline, never fixed sleeps."""

from __future__ import annotations

import asyncio

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.events.bus import Event
from tests.polling import until

__all__ = ["next_event", "text_of", "until"]


async def next_event(
    client: AsyncDispatcherClient,
    session_id: str,
    event_type: str,
    *,
    after_seq: int = 0,
    timeout: float = 20.0,
) -> Event:
    """The first event of ``event_type`` in the session after ``after_seq`` (replayed or live)."""

    async def find() -> Event:
        async for event in client.watch(session_id, after_seq=after_seq):
            if event.type == event_type:
                return event
        raise AssertionError(f"session closed before a {event_type} event")

    return await asyncio.wait_for(find(), timeout)


def text_of(result: object) -> str:
    return "".join(getattr(b, "text", "") for b in getattr(result, "content", ()))
