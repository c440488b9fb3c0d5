"""Waiting in tests without fixed sleeps: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

DEFAULT_TIMEOUT = 10.0


async def until(
    predicate: Callable[[], bool | Awaitable[bool]],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
) -> None:
    """Poll ``predicate`` (sync or async) every ``interval`` s; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


def until_sync(
    predicate: Callable[[], bool],
    what: str = "the condition",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
) -> None:
    """``until`` for code without an event loop (blocking waits in plain threads)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
