"""Every event payload crosses the wire and comes back as it was (``event_to_pb`` has a case for each)."""

from __future__ import annotations

import pytest

from dispatcher.core.events import payloads as ep
from dispatcher.core.events.bus import Event
from dispatcher.wire import convert

SAMPLES: tuple[ep.EventPayload, ...] = (
    ep.ToolCalled("echo", "read", {"text": "hi"}),
    ep.ToolOutputDelta("stderr", "x"),
    ep.ToolCompleted("echo", 1.5),
    ep.ToolFailed("shell", "timeout", "too slow", 2.0, partial_output="half"),
    ep.ToolInputInvalid("echo", ("text: required",)),
    ep.ToolConfirmationRequested("r1", "write_file", "{}", "write", ("a.txt",), diff="--- a\n+++ b\n"),
    ep.ToolStepProposed(3, "shell", "{}", "execute", ("b.txt",)),
    ep.ToolConfirmationResolved("r1", "deny", "timeout"),
    ep.StagedApplied(("stg_1",), ("a.txt",), ("stg_2",), ("b.txt",), ("b.txt changed on disk",)),
    ep.StagedDiscarded(("stg_3",), ("c.txt",)),
    ep.SessionExpiring("ttl", 30.0, 1_700_000_030.5),
    ep.SessionExpired("idle"),
    ep.SessionPaused("request"),
    ep.SessionResumed("request"),
    ep.ProcessStarted("p_1", "python3 app.py", 42, "background"),
    ep.ProcessExited("p_1", "exited", 0, None, 1234),
    ep.ProcessExited("p_2", "killed", None, 9, 0),
)


def test_the_samples_cover_every_payload_type() -> None:
    assert {p.TYPE for p in SAMPLES} == set(ep.PAYLOAD_TYPES)


@pytest.mark.parametrize("payload", SAMPLES, ids=lambda p: p.TYPE)
def test_every_payload_round_trips_through_the_wire(payload: ep.EventPayload) -> None:
    event = Event(7, 1_700_000_000.25, "s", "turn", "use", payload)
    back = convert.event_from_pb(convert.event_to_pb(event))
    assert back is not None
    assert (back.seq, back.session_id, back.turn_id, back.tool_use_id, back.type) == (
        7,
        "s",
        "turn",
        "use",
        payload.TYPE,
    )
    assert back.payload == payload
