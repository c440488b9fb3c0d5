"""A process watch in flight on the agent link: the pending-call kind ``AgentLink`` delivers a
``proc_watch``'s frames to (``AgentChannel.watch_process`` consumes it)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from dispatcher.sandbox.agent.protocol import Error, ProcData, ProcInfo

WATCH_BUFFER = 1 << 20
"""The most output bytes one process watch holds for a consumer that has not taken them yet."""


@dataclass(eq=False)
class WatchCall:
    """A ``proc_watch`` in flight: its frames wait here for the consumer, at most ``limit`` bytes.

    Bounded by re-subscribing, not by dropping: a frame that would pass ``limit`` while others
    wait ends the agent's watch (``proc_unwatch``; its later frames are ignored as late) and is
    not kept. The consumer takes what is buffered, then ``AgentChannel.watch_process`` watches
    again from the cursor after the last byte it took: what the process printed meanwhile is
    read from its ring in the sandbox, and what fell out of the ring arrives as ``lost``, exact.
    A slow consumer thus never grows the host's memory, and never slows the process either.
    """

    limit: int
    position: int
    """The cursor after the last byte taken into the buffer (where a new watch would start)."""
    items: deque[ProcData | ProcInfo | Error | BaseException] = field(default_factory=deque)
    buffered: int = 0
    overflowed: bool = False
    """The agent's watch was ended for want of room: once the buffer is taken, watch again."""
    first: bool = True
    ready: asyncio.Event = field(default_factory=asyncio.Event)

    def deliver(self, item: ProcData | ProcInfo | Error | BaseException) -> None:
        self.items.append(item)
        self.ready.set()

    async def next(self) -> ProcData | ProcInfo | Error | BaseException | None:
        """The next item; None once the buffer is empty after an overflow (watch again)."""
        while not self.items:
            if self.overflowed:
                return None
            self.ready.clear()
            await self.ready.wait()
        item = self.items.popleft()
        if isinstance(item, ProcData):
            self.buffered -= len(item.data)
        return item
