"""Per-session event bus: strictly increasing ``seq``, bounded replay history, live subscribers."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Generic, TypeVar

from dispatcher.core.events.payloads import (
    EVENT_TYPES,
    TOOL_CALLED,
    TOOL_COMPLETED,
    TOOL_CONFIRMATION_REQUESTED,
    TOOL_CONFIRMATION_RESOLVED,
    TOOL_FAILED,
    TOOL_INPUT_INVALID,
    TOOL_OUTPUT_DELTA,
    TOOL_STEP_PROPOSED,
    EventPayload,
    ToolOutputDelta,
)
from dispatcher.core.events.size import estimate_bytes, event_bytes

T = TypeVar("T")

__all__ = [
    "DEFAULT_MAX_BYTES",
    "EVENT_TYPES",
    "TOOL_CALLED",
    "TOOL_COMPLETED",
    "TOOL_CONFIRMATION_REQUESTED",
    "TOOL_CONFIRMATION_RESOLVED",
    "TOOL_FAILED",
    "TOOL_INPUT_INVALID",
    "TOOL_OUTPUT_DELTA",
    "TOOL_STEP_PROPOSED",
    "Backlog",
    "Event",
    "EventBus",
    "EventPayload",
    "Pacer",
    "Subscription",
    "estimate_bytes",
    "gap_text",
]


@dataclass(frozen=True, slots=True)
class Event:
    """One step of one tool call; ``payload`` says what (core/events/payloads.py)."""

    seq: int
    time: float
    session_id: str
    turn_id: str
    tool_use_id: str
    payload: EventPayload
    size: int = field(default=0, compare=False, repr=False)
    """Estimated bytes the event holds in memory (set by the bus at publish; 0 if unknown)."""

    @property
    def type(self) -> str:
        """``tool.called``, ``tool.output_delta``, ...: the payload's kind."""
        return self.payload.TYPE


# Backlogs ------------------------------------------------------------------------------------
#
# What one reader of events has not read yet. Every stream that follows a session (a Dispatch, each
# WatchSession) queues events for its client. A watcher that reads more slowly than a tool prints
# must neither slow the tool down nor grow the server's memory, and it must know it missed
# something. So past ``max_bytes`` (or ``max_items``) queued, a ``tool.output_delta`` is skipped
# and counted per call; before that call's next event reaches the queue, one delta saying
# ``[... N bytes of output skipped ...]`` takes the skipped ones' place, with the seq of the last of
# them (so the seqs a reader sees still only increase). Every other event, and anything queued with
# ``put`` (a Dispatch's results), is never skipped: those are bounded where they are made.
#
# The caller of a Dispatch is not a watcher: its own output must reach it whole, so its backlog is
# *paced* (``paced_bytes``). Past ``max_bytes`` it skips nothing; ``room()`` gives the producer a
# future to wait on instead (done once the reader has taken the backlog down to half), and the
# producer (a command's output, through the bus's ``room``) stops reading until then, which slows
# the command as a terminal would. Only past ``paced_bytes``, a producer that could not wait (a
# command being stopped, a tool that does not pace) has its deltas skipped and marked as above:
# memory stays bounded per reader whatever a producer does.

DEFAULT_MAX_BYTES = 1 << 20
"""Per reader: (estimated) bytes of events queued before output deltas are skipped."""
_MARKER_BYTES = 512


def gap_text(skipped: int) -> str:
    """The text of the delta that stands for ``skipped`` bytes of output a reader missed."""
    return f"\n[... {skipped:,} bytes of output skipped: this stream fell behind ...]\n"


@dataclass(slots=True)
class _Gap:
    last: Event  # the last delta skipped: the marker takes its seq and stream
    skipped: int = 0  # UTF-8 bytes of text skipped


class Backlog(Generic[T]):
    """A FIFO of events and other items (``T``) for one reader; see the module docstring."""

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, max_items: int = 4096, *, paced_bytes: int = 0
    ) -> None:
        """``paced_bytes``: 0 for a watcher's backlog; else the caller's, paced past ``max_bytes``
        (``room``) and skipping output deltas only past ``paced_bytes`` (or twice ``max_items``)."""
        self._items: deque[tuple[Event | T, int]] = deque()
        self._gaps: dict[tuple[str, str], _Gap] = {}
        self._max_bytes = max_bytes
        self._max_items = max_items
        self._skip_bytes = max(paced_bytes, max_bytes)
        self._skip_items = 2 * max_items if paced_bytes else max_items
        self._room: asyncio.Future[None] | None = None
        self._released = not paced_bytes  # a watcher's backlog never asks anyone to wait
        self._wakeup = asyncio.Event()
        self.bytes = 0
        """Estimated bytes queued now."""
        self.skipped = 0
        """Output deltas skipped so far."""

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Event | T]:
        """What is queued now, oldest first, without taking it."""
        return (item for item, _ in tuple(self._items))

    def offer(self, event: Event, *, bounded: bool = True) -> None:
        """Queue ``event``, unless it is an output delta that does not fit (``bounded``: False for
        events that live in the bus's history anyway, a replay: they cost this reader no bytes)."""
        key = (event.turn_id, event.tool_use_id)
        if event.type == TOOL_OUTPUT_DELTA and bounded and not self._fits(event.size):
            # A watcher's past max_bytes; a paced backlog's only past paced_bytes.
            gap = self._gaps.get(key)
            if gap is None:
                gap = self._gaps[key] = _Gap(event)
            gap.last = event
            text = event.payload.text if isinstance(event.payload, ToolOutputDelta) else ""
            gap.skipped += len(text.encode("utf-8", "surrogatepass"))
            self.skipped += 1
            return
        gap = self._gaps.pop(key, None)
        if gap is not None:
            self._append(_marker(gap), _MARKER_BYTES)
        self._append(event, event.size)

    def put(self, item: T, size: int) -> None:
        """Queue ``item``, never skipped (a call's gap is marked before its final event already)."""
        self._append(item, size)

    async def get(self) -> Event | T:
        """The oldest item; waits for one."""
        while not self._items:
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._take()

    def get_nowait(self) -> Event | T | None:
        """The oldest item, or None."""
        if not self._items:
            return None
        return self._take()

    def _take(self) -> Event | T:
        item, size = self._items.popleft()
        self.bytes -= size
        room = self._room
        if (
            room is not None
            and self.bytes <= self._max_bytes // 2
            and len(self._items) <= self._max_items // 2
        ):
            self._room = None
            if not room.done():
                room.set_result(None)
        return item

    def room(self) -> asyncio.Future[None] | None:
        """A paced backlog past ``max_bytes`` (or ``max_items``): a future done when its reader
        has taken it down to half, or it is released; None when a producer may go on now."""
        if self._released or (self.bytes < self._max_bytes and len(self._items) < self._max_items):
            return None
        if self._room is None:
            self._room = asyncio.get_running_loop().create_future()
        return self._room

    def release(self) -> None:
        """Nobody reads any more (the call ended, its client went away): no producer waits."""
        self._released = True
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)

    async def wait(self) -> None:
        """Until an item is queued or ``wake`` is called."""
        if not self._items:
            self._wakeup.clear()
            await self._wakeup.wait()

    def wake(self) -> None:
        """Wake a waiting ``get`` (whoever closes the reader's stream calls it)."""
        self._wakeup.set()

    def _fits(self, size: int) -> bool:
        return self.bytes + size <= self._skip_bytes and len(self._items) < self._skip_items

    def _append(self, item: Event | T, size: int) -> None:
        self._items.append((item, size))
        self.bytes += size
        self._wakeup.set()


def _marker(gap: _Gap) -> Event:
    last = gap.last
    stream = last.payload.stream if isinstance(last.payload, ToolOutputDelta) else "stdout"
    return dataclasses.replace(
        last, payload=ToolOutputDelta(stream=stream, text=gap_text(gap.skipped)), size=_MARKER_BYTES
    )


EventFilter = Callable[[Event], bool]
Pacer = Callable[[str, str], "asyncio.Future[None] | None"]
"""``(turn_id, tool_use_id)`` -> a future while that call's output must wait (``EventBus.room``)."""
_EVENT_OVERHEAD = 256  # the Event object, its seq and time, the deque slot


class Subscription:
    """An async iterator of events; replays history first, then follows live.

    A subscriber that falls behind by more than ``max_pending`` events or ``max_bytes`` (estimated)
    bytes misses live ``tool.output_delta`` events rather than growing memory or slowing anyone,
    and gets one delta saying how many bytes it missed in their place (``core/backlog.py``); other
    events are never dropped.
    """

    def __init__(
        self,
        bus: EventBus,
        event_filter: EventFilter | None,
        max_pending: int,
        after_seq: int = 0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._bus = bus
        self._filter = event_filter
        # Nothing at or below the client's cursor is delivered, replayed or live: a cursor ahead
        # of the bus (a client that saw a later server life, or guessed) must not get old seqs.
        self._after_seq = after_seq
        self._pending: Backlog[Event] = Backlog(max_bytes, max_pending)
        self._closed = False

    @property
    def dropped(self) -> int:
        """Output deltas this subscriber missed."""
        return self._pending.skipped

    def _offer(self, event: Event, *, replay: bool = False) -> None:
        if event.seq <= self._after_seq:
            return
        if self._filter is not None and not self._filter(event):
            return
        self._pending.offer(event, bounded=not replay)

    def close(self) -> None:
        """Stop following; pending events are still delivered, then iteration ends."""
        if not self._closed:
            self._closed = True
            self._bus._unsubscribe(self)
            self._pending.wake()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self

    async def __anext__(self) -> Event:
        while True:
            event = self._pending.get_nowait()
            if event is not None:
                return event
            if self._closed:
                raise StopAsyncIteration
            await self._pending.wait()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class EventBus:
    """Events of one session. Publishing is synchronous and never blocks.

    The replay history keeps at most ``history`` events and ``history_bytes`` (estimated) bytes:
    the oldest leave first, and an event bigger than the whole budget is delivered live only.
    """

    def __init__(
        self,
        session_id: str,
        *,
        history: int = 10_000,
        history_bytes: int = 8 << 20,
        max_pending: int = 4096,
        max_pending_bytes: int = DEFAULT_MAX_BYTES,
        start_seq: int = 0,
    ) -> None:
        """``start_seq``: the last seq a previous life of the session gave (a restarted server
        goes on from there, so a client's cursor stays valid)."""
        self.session_id = session_id
        self._history: deque[Event] = deque()
        self._history_cap = history
        self._history_budget = history_bytes
        self.history_bytes = 0
        """Estimated bytes the replay history holds now (never more than ``history_bytes``)."""
        self._subscribers: list[Subscription] = []
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes  # per subscriber (core/backlog.py)
        self._seq = start_seq
        self._closed = False
        self.sink: Callable[[Event], None] | None = None
        """Called with every published event, inside ``publish`` (persistence); must be quick."""
        self._pacers: list[Pacer] = []

    @property
    def last_seq(self) -> int:
        return self._seq

    def publish(self, payload: EventPayload, *, turn_id: str, tool_use_id: str) -> Event:
        """Stamp and deliver one event to history and every subscriber."""
        self._seq += 1
        size = _EVENT_OVERHEAD + event_bytes(turn_id, tool_use_id, payload)
        event = Event(self._seq, time.time(), self.session_id, turn_id, tool_use_id, payload, size)
        self._remember(event)
        if self.sink is not None:
            self.sink(event)
        for sub in tuple(self._subscribers):
            sub._offer(event)
        return event

    def room(self, turn_id: str, tool_use_id: str) -> asyncio.Future[None] | None:
        """Whether a call's producer may go on publishing output now (None), or a future to wait
        on first: a reader that must get every delta of that call (its Dispatch's caller) is full.
        Watchers never make anyone wait."""
        for pacer in self._pacers:
            room = pacer(turn_id, tool_use_id)
            if room is not None:
                return room
        return None

    def pace(self, pacer: Pacer) -> None:
        """Have ``room`` ask ``pacer`` (a reader that must get every delta of its calls)."""
        self._pacers.append(pacer)

    def unpace(self, pacer: Pacer) -> None:
        """Stop asking ``pacer``; idempotent."""
        if pacer in self._pacers:
            self._pacers.remove(pacer)

    def restore(self, events: Iterable[Event]) -> None:
        """Put a previous life's retained events back into the replay history (oldest first,
        before anything is published); the seq goes on after the highest one."""
        for event in events:
            if event.session_id != self.session_id:
                continue
            if event.size <= 0:
                size = _EVENT_OVERHEAD + estimate_bytes((event.turn_id, event.tool_use_id, event.payload))
                event = replace(event, size=size)
            self._remember(event)
            self._seq = max(self._seq, event.seq)

    def subscribe(
        self, after_seq: int | None = None, event_filter: EventFilter | None = None
    ) -> Subscription:
        """Follow live events; with ``after_seq``, first replay retained events with a greater seq.

        No event with ``seq <= after_seq`` is ever delivered, live ones included.

        ``event_filter`` is called synchronously inside ``publish``, in publish order, before
        ``publish`` returns: a caller may rely on that (for example to tap events into its own queue
        at the moment they happen). It must be quick and must not publish.
        """
        sub = Subscription(self, event_filter, self._max_pending, after_seq or 0, self._max_pending_bytes)
        if after_seq is not None:
            for event in self._history:
                sub._offer(event, replay=True)
        if self._closed:
            sub.close()
        else:
            self._subscribers.append(sub)
        return sub

    def _remember(self, event: Event) -> None:
        history = self._history
        history.append(event)
        self.history_bytes += event.size
        while history and (len(history) > self._history_cap or self.history_bytes > self._history_budget):
            self.history_bytes -= history.popleft().size

    def close(self) -> None:
        """End every subscription (after it drains)."""
        self._closed = True
        for sub in tuple(self._subscribers):
            sub.close()

    def _unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscribers:
            self._subscribers.remove(sub)
