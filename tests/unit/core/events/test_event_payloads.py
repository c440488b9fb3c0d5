"""The stored form of event payloads: every type round-trips, and a damaged row is refused by type."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.events import payloads as ep

FULL: tuple[ep.EventPayload, ...] = (  # every type, every field set (optional ones too)
    ep.ToolCalled("echo", "none", {"text": ["a", 1, None]}),
    ep.ToolOutputDelta("stderr", "x"),
    ep.ToolCompleted("echo", 1.5),
    ep.ToolFailed("shell", "timeout", "too slow", 2.0, partial_output="half", reason="server restarted"),
    ep.ToolInputInvalid("echo", ("text: required", "extra: not allowed")),
    ep.ToolConfirmationRequested("r1", "write_file", "{}", "write", ("a.txt",), diff="--- a\n+++ b\n"),
    ep.ToolStepProposed(3, "shell", "{}", "execute", ("b.txt",)),
    ep.ToolConfirmationResolved("r1", None, "timeout"),
    ep.StagedApplied(("stg_1",), ("a.txt",), ("stg_2",), ("b.txt",), ("b.txt changed on disk",)),
    ep.StagedDiscarded(("stg_3",), ("c.txt",)),
    ep.SessionExpiring("ttl", 30.0, 1_700_000_030.5),
    ep.SessionExpired("idle"),
    ep.SessionPaused("request"),
    ep.SessionResumed("request"),
    ep.ProcessStarted("p_1", "python3 app.py", 42, "background"),
    ep.ProcessExited("p_1", "killed", None, 15, 1234),
)


def test_the_samples_cover_every_payload_type() -> None:
    assert {p.TYPE for p in FULL} == set(ep.PAYLOAD_TYPES)


@pytest.mark.parametrize("payload", FULL, ids=lambda p: p.TYPE)
def test_every_payload_round_trips_through_its_stored_form(payload: ep.EventPayload) -> None:
    assert ep.payload_from_dict(payload.TYPE, ep.to_dict(payload)) == payload


def test_an_integer_duration_is_read_as_a_number_and_an_absent_optional_field_as_its_default() -> None:
    read = ep.payload_from_dict(
        ep.TOOL_FAILED, {"tool_name": "t", "error_class": None, "message": "m", "duration_ms": 3}
    )
    assert read == ep.ToolFailed("t", None, "m", 3.0)
    assert isinstance(read, ep.ToolFailed) and type(read.duration_ms) is float


@pytest.mark.parametrize(
    ("type_", "data", "fragment"),
    [
        (ep.TOOL_COMPLETED, {"tool_name": "t", "duration_ms": "1"}, "'duration_ms' is not a number"),
        (ep.TOOL_COMPLETED, {"tool_name": "t", "duration_ms": True}, "'duration_ms' is not a number"),
        (ep.TOOL_COMPLETED, {"tool_name": 7, "duration_ms": 1}, "'tool_name' is not a string"),
        (ep.TOOL_COMPLETED, {"tool_name": None, "duration_ms": 1}, "'tool_name' is not a string"),
        (ep.TOOL_COMPLETED, {"tool_name": "t"}, "'duration_ms' is missing"),
        (
            ep.TOOL_STEP_PROPOSED,
            {
                "step": 1.0,
                "tool_name": "t",
                "input_summary": "",
                "side_effect": None,
                "projected_modifications": [],
            },
            "'step' is not an integer",
        ),
        (
            ep.TOOL_STEP_PROPOSED,
            {
                "step": False,
                "tool_name": "t",
                "input_summary": "",
                "side_effect": None,
                "projected_modifications": [],
            },
            "'step' is not an integer",
        ),
        (ep.TOOL_INPUT_INVALID, {"tool_name": "t", "errors": "abc"}, "'errors' is not a list of strings"),
        (ep.TOOL_INPUT_INVALID, {"tool_name": "t", "errors": ["a", 1]}, "'errors' is not a list of strings"),
        (
            ep.TOOL_CONFIRMATION_RESOLVED,
            {"request_id": "r", "decision": 1, "reason": "client"},
            "'decision' is not a string",
        ),
        ("tool.nope", {}, "unknown event type"),
        (ep.TOOL_COMPLETED, ["tool_name"], "the payload is not an object"),
    ],
)
def test_a_damaged_row_is_refused_naming_the_field(type_: str, data: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ep.payload_from_dict(type_, data)
