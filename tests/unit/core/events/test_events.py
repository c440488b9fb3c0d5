"""The per-session event bus: ordering, replay, live follow, bounded history, slow subscribers."""

from __future__ import annotations

import asyncio

from dispatcher.core.events import bus as ev
from dispatcher.core.events import payloads as ep
from dispatcher.core.events.bus import EventBus
from dispatcher.core.events.payloads import ToolCompleted, ToolOutputDelta

_SAMPLES: dict[str, ep.EventPayload] = {
    ev.TOOL_CALLED: ep.ToolCalled("echo", "none", {}),
    ev.TOOL_OUTPUT_DELTA: ep.ToolOutputDelta("stdout", "x"),
    ev.TOOL_COMPLETED: ep.ToolCompleted("echo", 1.0),
}


def publish(bus: EventBus, n: int, type_: str = ev.TOOL_CALLED) -> None:
    for i in range(n):
        bus.publish(_SAMPLES[type_], turn_id="t", tool_use_id=f"u{i}")


async def drain(sub: ev.Subscription) -> list[ev.Event]:
    sub.close()
    return [e async for e in sub]


async def test_seq_strictly_increases_and_replay_from_after_seq() -> None:
    bus = EventBus("s")
    publish(bus, 5)
    events = await drain(bus.subscribe(after_seq=2))
    assert [e.seq for e in events] == [3, 4, 5] and bus.last_seq == 5
    assert all(e.session_id == "s" and e.type == ev.TOOL_CALLED for e in events)


async def test_replay_then_live() -> None:
    bus = EventBus("s")
    publish(bus, 2)
    async with bus.subscribe(after_seq=0) as sub:
        got = [await anext(sub), await anext(sub)]
        waiter = asyncio.create_task(anext(sub))
        await asyncio.sleep(0)
        assert not waiter.done()
        publish(bus, 1)
        got.append(await waiter)
    assert [e.seq for e in got] == [1, 2, 3]


async def test_history_is_bounded() -> None:
    bus = EventBus("s", history=3)
    publish(bus, 10)
    assert [e.seq for e in await drain(bus.subscribe(after_seq=0))] == [8, 9, 10]


async def test_filter() -> None:
    bus = EventBus("s")
    sub = bus.subscribe(event_filter=lambda e: e.tool_use_id == "u1")
    publish(bus, 3)
    assert [e.tool_use_id for e in await drain(sub)] == ["u1"]


async def test_slow_subscriber_drops_only_output_deltas() -> None:
    bus = EventBus("s", max_pending=4)
    sub = bus.subscribe()
    publish(bus, 10, ev.TOOL_OUTPUT_DELTA)
    publish(bus, 3, ev.TOOL_COMPLETED)
    events = await drain(sub)
    assert [e.type for e in events].count(ev.TOOL_OUTPUT_DELTA) == 4 and sub.dropped == 6
    assert [e.type for e in events][-3:] == [ev.TOOL_COMPLETED] * 3


async def test_a_subscriber_past_its_bytes_gets_one_gap_marker_before_the_calls_next_event() -> None:
    bus = EventBus("s", max_pending_bytes=64 << 10)
    sub = bus.subscribe()
    for _ in range(40):  # 40 x 4 KiB: about 16 fit, the rest are skipped
        bus.publish(ToolOutputDelta("stdout", "x" * 4096), turn_id="t", tool_use_id="u")
    last = bus.publish(ToolCompleted("shell", 1.0), turn_id="t", tool_use_id="u")
    events = await drain(sub)
    texts = [e.payload.text for e in events if isinstance(e.payload, ToolOutputDelta)]
    marker = texts[-1]
    shown = sum(len(t) for t in texts[:-1])
    assert marker == ev.gap_text(40 * 4096 - shown) and sub.dropped == 40 - len(texts[:-1])
    assert events[-1] is last and events[-2].seq == last.seq - 1  # the last skipped delta's seq
    assert [e.seq for e in events] == sorted({e.seq for e in events})


async def test_replayed_history_is_not_cut_by_the_byte_bound() -> None:
    bus = EventBus("s", max_pending_bytes=16 << 10)
    for _ in range(20):
        bus.publish(ToolOutputDelta("stdout", "y" * 4096), turn_id="t", tool_use_id="u")
    events = await drain(bus.subscribe(after_seq=0))  # they are in the history's memory anyway
    assert len(events) == 20


async def test_close_ends_subscriptions_after_draining() -> None:
    bus = EventBus("s")
    sub = bus.subscribe()
    publish(bus, 2)
    bus.close()
    assert len([e async for e in sub]) == 2
    late = bus.subscribe(after_seq=0)
    assert len([e async for e in late]) == 2  # a closed bus still replays, then ends


async def test_after_seq_beyond_the_bus_never_delivers_lower_seqs_live() -> None:
    bus = EventBus("s")
    publish(bus, 2)
    sub = bus.subscribe(after_seq=5)
    publish(bus, 5)  # seqs 3..7: only 6 and 7 are after the cursor
    assert [e.seq for e in await drain(sub)] == [6, 7]


async def test_after_seq_applies_to_filtered_live_subscriptions() -> None:
    bus = EventBus("s")
    sub = bus.subscribe(after_seq=1, event_filter=lambda e: e.seq != 3)
    publish(bus, 4)
    assert [e.seq for e in await drain(sub)] == [2, 4]


def test_the_size_estimate_counts_every_string_a_payload_holds() -> None:
    big = "x" * 100_000
    assert ev.estimate_bytes(ep.ToolOutputDelta("stdout", big)) >= 100_000
    nested = ep.ToolCalled("shell", "execute", {"command": [big, {"k": big + "y"}]})
    assert ev.estimate_bytes(nested) >= 200_000
    failed = ep.ToolFailed("shell", "timeout", big, 1.0, partial_output=big + "z")
    assert ev.estimate_bytes(failed) >= 200_000
    asked = ep.ToolConfirmationRequested("cr", "write_file", big, "write", (big + "a",), diff=big + "b")
    assert ev.estimate_bytes(asked) >= 300_000
    shared = ep.ToolInputInvalid("t", (big,) * 3)  # one string three times: counted each time, from above
    assert ev.estimate_bytes(shared) >= 100_000


def test_the_history_budget_is_spent_on_the_payloads_bytes() -> None:
    bus = EventBus("s", history=1000, history_bytes=250_000)
    for i in range(5):
        event = bus.publish(ep.ToolOutputDelta("stdout", "x" * 100_000), turn_id="t", tool_use_id=f"u{i}")
        assert event.size >= 100_000
    assert bus.history_bytes <= 250_000
    assert len(bus._history) == 2  # only what fits the byte budget is kept for replay


def test_an_events_type_comes_from_its_payload_class_and_payloads_are_frozen() -> None:
    import dataclasses

    import pytest

    bus = EventBus("s")
    for type_, cls in ep.PAYLOAD_TYPES.items():
        assert type_ == cls.TYPE and "__slots__" in vars(cls)
    event = bus.publish(ep.ToolCompleted("echo", 1.0), turn_id="t", tool_use_id="u")
    assert event.type == ev.TOOL_COMPLETED and isinstance(event.payload, ep.ToolCompleted)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.payload.tool_name = "other"  # type: ignore[misc]
    assert set(ep.EVENT_TYPES) == {
        "tool.called", "tool.output_delta", "tool.completed", "tool.failed", "tool.input_invalid",
        "tool.confirmation_requested", "tool.confirmation_resolved", "tool.step_proposed",
        "staged.applied", "staged.discarded",
        "session.expiring", "session.expired", "session.paused", "session.resumed",
        "process.started", "process.exited",
    }  # fmt: skip
