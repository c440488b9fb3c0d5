"""One scheduler for every session's deadlines: a heap and a single task, not a timer per session.

An entry is (deadline, key). Setting a key again replaces its deadline; the old heap item is left
in place and skipped when it surfaces (its generation is stale), so a set or a cancel is O(log n)
and 1,000 expirations cost a heap walk. ``due`` is the whole logic and takes the time as an
argument: tests drive it with a made-up clock, no sleeps. ``run`` is the task: it sleeps until the
earliest deadline (or until an earlier one is set) and hands what is due to its callback.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["DeadlineScheduler"]

log = logging.getLogger("dispatcher.core.expiry")  # the name operators know; kept across the move

K = TypeVar("K", bound=Hashable)


class DeadlineScheduler(Generic[K]):
    """Deadlines by key; ``due(now)`` pops those that have passed, earliest first."""

    def __init__(self, clock: Callable[[], float]) -> None:
        """``clock``: the time deadlines are given in (wall-clock epoch seconds for sessions)."""
        self._clock = clock
        self._heap: list[tuple[float, int, K]] = []
        self._current: dict[K, int] = {}
        self._generation = itertools.count()
        self._wake = asyncio.Event()
        self._handling: set[asyncio.Task[None]] = set()

    def set(self, key: K, deadline: float) -> None:
        """Fire ``key`` at ``deadline`` (replacing its earlier deadline)."""
        gen = next(self._generation)
        self._current[key] = gen
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (deadline, gen, key))
        if earliest is None or deadline < earliest:
            self._wake.set()

    def cancel(self, key: K) -> None:
        """Forget ``key``'s deadline (its heap item is skipped when it surfaces)."""
        self._current.pop(key, None)

    def deadline(self, key: K) -> float | None:
        """When ``key`` fires; None: it is not scheduled."""
        gen = self._current.get(key)
        if gen is None:
            return None
        return next((d for d, g, k in self._heap if g == gen), None)

    def __len__(self) -> int:
        return len(self._current)

    def next_deadline(self) -> float | None:
        """The earliest live deadline (stale heap items are dropped on the way)."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[K]:
        """Pop every key whose deadline is ``now`` or earlier, earliest first."""
        out: list[K] = []
        while True:
            self._drop_stale()
            if not self._heap or self._heap[0][0] > now:
                return out
            _, _, key = heapq.heappop(self._heap)
            del self._current[key]
            out.append(key)

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._current.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)

    async def run(self, handle: Callable[[list[K]], Awaitable[None]], *, max_wait: float = 60.0) -> None:
        """Forever: wait for the earliest deadline, then ``handle`` what is due (its errors are
        logged, never stop the loop). ``max_wait`` bounds one wait, so a wall clock that jumps is
        noticed within it."""
        while True:
            self._wake.clear()
            nearest = self.next_deadline()
            delay = max_wait if nearest is None else min(max(nearest - self._clock(), 0.0), max_wait)
            if delay > 0:
                try:
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                    continue  # an earlier deadline was set: wait for that one instead
                except TimeoutError:
                    pass
            keys = self.due(self._clock())
            if keys:
                # In a task of its own: a slow sandbox query delays its sessions, not the next
                # deadlines of every other session.
                task = asyncio.create_task(self._handle(handle, keys))
                self._handling.add(task)
                task.add_done_callback(self._handling.discard)

    async def stop_handling(self) -> None:
        """Cancel the handling under way (a stop) and wait for it to end."""
        tasks = tuple(self._handling)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _handle(handle: Callable[[list[K]], Awaitable[None]], keys: list[K]) -> None:
        try:
            await handle(keys)
        except Exception:
            log.exception("handling %d due deadline(s) failed", len(keys))
