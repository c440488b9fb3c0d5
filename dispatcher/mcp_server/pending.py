"""Calls held between an ``InputRequiredResult`` and the client's retry (MCP 2026-07-28).

The ``requestState`` handed to the client is a random key into this table, not the state itself:
nothing the client echoes is trusted beyond naming a call, and a key is good for one retry. The
table is bounded: when it is full the oldest held call is cancelled, like a client that never came
back. A call held while nobody retries still ends by itself at the server's confirmation timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import OrderedDict
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from dispatcher.client.base import DispatchItem
from dispatcher.core.events.payloads import ToolConfirmationRequested


@dataclass(eq=False)
class Pending:
    """One ``tools/call`` in flight: its Dispatch stream and what it asked."""

    tool_use_id: str
    items: AsyncGenerator[DispatchItem, None]
    progress: int = 0
    """Output characters sent as progress so far (MCP progress must only grow)."""
    asked: dict[str, ToolConfirmationRequested] = field(default_factory=dict)
    """Confirmation requests put to the client and not answered yet, by request id."""


_closing: set[asyncio.Task[None]] = set()
"""Closes under way (the loop keeps only weak references to tasks)."""


class PendingCalls:
    """Held calls by ``requestState`` key, at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one call must be holdable")
        self._limit = limit
        self._held: OrderedDict[str, Pending] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def park(self, call: Pending) -> str:
        """Hold ``call`` for a retry; returns the key the client echoes as ``requestState``."""
        while len(self._held) >= self._limit:
            _, oldest = self._held.popitem(last=False)
            _schedule_close(oldest)
        key = secrets.token_urlsafe(24)
        self._held[key] = call
        return key

    def take(self, key: str) -> Pending | None:
        """The call held under ``key``, no longer held; None for an unknown or used key."""
        return self._held.pop(key, None)

    async def aclose(self) -> None:
        """Cancel every held call (the MCP session ends)."""
        while self._held:
            _, call = self._held.popitem()
            with contextlib.suppress(Exception):
                await call.items.aclose()


def _schedule_close(call: Pending) -> None:
    task = asyncio.get_running_loop().create_task(call.items.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)
