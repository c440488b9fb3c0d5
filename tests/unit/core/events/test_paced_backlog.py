"""The Dispatch caller's backlog is paced (issue 37 item 1): past its bytes it asks the producer to
wait instead of skipping, skips (marked) only past its hard bound, and a watcher's never paces."""

from __future__ import annotations

import asyncio

from dispatcher.core.events import bus as ev
from dispatcher.core.events.bus import Backlog, EventBus
from dispatcher.core.events.payloads import ToolCompleted, ToolOutputDelta

KIB = 1 << 10


def delta(bus: EventBus, text: str, tid: str = "u") -> ev.Event:
    return bus.publish(ToolOutputDelta("stdout", text), turn_id="t", tool_use_id=tid)


async def test_past_its_bytes_a_paced_backlog_asks_to_wait_and_skips_nothing() -> None:
    bus = EventBus("s")
    queue: Backlog[None] = Backlog(64 * KIB, paced_bytes=256 * KIB)
    for _ in range(10):  # about 45 KiB with what each event weighs besides its text
        queue.offer(delta(bus, "x" * 4096))
        assert queue.room() is None  # below its bytes: go on
    while queue.room() is None:
        queue.offer(delta(bus, "x" * 4096))
    room = queue.room()
    assert room is not None and not room.done() and queue.skipped == 0
    assert queue.room() is room  # one future for every producer that asks
    for _ in range(len(queue) // 2 - 1):  # the reader takes it down, but not yet to half
        queue.get_nowait()
    assert not room.done()
    while not room.done():
        queue.get_nowait()
    assert queue.bytes <= 32 * KIB and queue.room() is None


async def test_a_producer_that_does_not_wait_is_skipped_past_the_hard_bound_with_a_counted_marker() -> None:
    bus = EventBus("s")
    queue: Backlog[None] = Backlog(16 * KIB, paced_bytes=64 * KIB)
    for _ in range(40):  # 40 x 4 KiB, never waiting: about 16 fit under the hard bound
        queue.offer(delta(bus, "y" * 4096))
    queue.offer(bus.publish(ToolCompleted("shell", 1.0), turn_id="t", tool_use_id="u"))
    texts = [
        e.payload.text for e in queue if isinstance(e, ev.Event) and isinstance(e.payload, ToolOutputDelta)
    ]
    shown = sum(len(t) for t in texts[:-1])
    assert queue.skipped > 0 and texts[-1] == ev.gap_text(40 * 4096 - shown)
    assert queue.bytes <= 64 * KIB + 1024


async def test_release_lets_every_waiting_producer_go_on_for_good() -> None:
    bus = EventBus("s")
    queue: Backlog[None] = Backlog(8 * KIB, paced_bytes=64 * KIB)
    for _ in range(4):
        queue.offer(delta(bus, "z" * 4096))
    room = queue.room()
    assert room is not None
    queue.release()  # the caller went away
    assert room.done() and queue.room() is None


async def test_the_bus_asks_its_pacers_for_their_calls_only_and_watchers_never_pace() -> None:
    bus = EventBus("s", max_pending_bytes=8 * KIB)
    watcher = bus.subscribe()
    caller: Backlog[None] = Backlog(8 * KIB, paced_bytes=64 * KIB)

    def pace(turn_id: str, tool_use_id: str) -> asyncio.Future[None] | None:
        return caller.room() if tool_use_id == "mine" else None

    for _ in range(8):
        caller.offer(delta(bus, "w" * 4096, "mine"))
    assert bus.room("t", "mine") is None  # nobody paces yet: the watcher alone never does
    bus.pace(pace)
    assert bus.room("t", "mine") is caller.room() is not None
    assert bus.room("t", "other") is None
    bus.unpace(pace)
    assert bus.room("t", "mine") is None
    assert watcher.dropped > 0  # the watcher skipped meanwhile, as before
