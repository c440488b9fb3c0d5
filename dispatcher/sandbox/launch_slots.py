"""Launch slots: a few container launches (and re-adoptions) at a time, a waiting call first.

Launching every container at once on a small machine makes every agent miss its start deadline,
so both container providers bound them. Work nobody waits for (re-adopting every session's
container after a restart, a warm pool's refill, a container started at session creation) must
not make a call wait behind it: a call that needs a container takes the next free slot before
any of that does. Each kind keeps its own order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextvars import ContextVar

_BACKGROUND: ContextVar[bool] = ContextVar("dispatcher_background_launch", default=False)


@contextlib.contextmanager
def in_background() -> Iterator[None]:
    """Launches made in this block (and in tasks it creates) wait behind every call's."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


class LaunchSlots:
    """``size`` slots; a waiting call is served before any background launch."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._calls: deque[asyncio.Future[None]] = deque()
        self._background: deque[asyncio.Future[None]] = deque()

    @contextlib.asynccontextmanager
    async def take(self) -> AsyncIterator[None]:
        """Hold one slot for the block: at once if one is free and nobody waits, else in turn."""
        await self._acquire(_BACKGROUND.get())
        try:
            yield
        finally:
            self._release()

    @property
    def waiting(self) -> int:
        return len(self._calls) + len(self._background)

    async def _acquire(self, background: bool) -> None:
        if self._free > 0 and not self._calls and not self._background:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._background if background else self._calls
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # handed a slot as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # already skipped by a release
                    queue.remove(turn)
            raise

    def _release(self) -> None:
        for queue in (self._calls, self._background):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1
