"""A tenant's slots for one kind of work (dispatches, transfers): a limit, and a FIFO queue to wait in.

With every slot taken, a request waits up to ``timeout`` seconds, first come first served (a slot
freed is handed to the oldest waiter, never grabbed by a newcomer), then is refused with
RESOURCE_EXHAUSTED; ``timeout`` 0 refuses at once.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from dispatcher.server.requests.errors import QuotaExceeded

__all__ = ["Slot", "Slots"]


class Slots:
    """``limit`` slots (None: unlimited) with a FIFO queue of waiters."""

    def __init__(
        self, limit: int | None, timeout: float, *, observe: Callable[[float], None] | None = None
    ) -> None:
        """``observe``: told how long each admitted request waited (0 when it did not)."""
        self.limit = limit
        self.timeout = timeout
        self.used = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._observe = observe

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def slot(self, refusal: str) -> Slot:
        """Hold a slot for the block (``async with``).

        Raises:
            QuotaExceeded: ``refusal`` (said how long it waited, if it did).
        """
        return Slot(self, refusal)

    async def _acquire(self, refusal: str) -> None:
        if self.limit is None or (self.used < self.limit and not self.waiting):
            self.used += 1
            self._waited(0.0)
            return
        if self.timeout <= 0:
            raise QuotaExceeded(refusal)
        started = time.monotonic()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.timeout):
                await asyncio.shield(waiter)
        except TimeoutError:
            if not waiter.done():
                waiter.cancel()
                raise QuotaExceeded(f"{refusal}; waited {self.timeout:g} s (queue_timeout_seconds)") from None
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot just as the caller went away: pass it on
            else:
                waiter.cancel()
            raise
        finally:
            if waiter in self._waiters and waiter.done():
                self._waiters.remove(waiter)
        self._waited(time.monotonic() - started)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: ``used`` stays
                return
        self.used -= 1

    def _waited(self, seconds: float) -> None:
        if self._observe is not None:
            self._observe(seconds)


class Slot:
    """One slot held for an ``async with`` block: a class rather than a generator, because every
    Dispatch enters one (a generator-based context manager costs several times as much)."""

    __slots__ = ("_refusal", "_slots")

    def __init__(self, slots: Slots, refusal: str) -> None:
        self._slots = slots
        self._refusal = refusal

    async def __aenter__(self) -> None:
        await self._slots._acquire(self._refusal)

    async def __aexit__(self, *exc_info: object) -> None:
        self._slots._release()
