"""Waiting helpers: on events or by polling with a deadline, never fixed sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.events import Event


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


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll a condition with a deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def text_of(result: object) -> str:
    return "".join(getattr(b, "text", "") for b in getattr(result, "content", ()))
