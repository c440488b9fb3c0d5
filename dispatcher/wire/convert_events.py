"""Proto <-> domain for the events a session publishes (WatchSession and Dispatch streams), both
directions: every payload kind, the staged and session ones through their own modules.

A client skips an event whose payload it does not know (a newer server's) rather than fail.
"""

from __future__ import annotations

import json
from typing import assert_never

from dispatcher.core.events import payloads as ep
from dispatcher.core.events.bus import Event
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert_lifecycle as cl
from dispatcher.wire import convert_staged
from dispatcher.wire.convert_enums import (
    decision_from_pb,
    decision_to_pb,
    error_class_from_pb,
    error_class_to_pb,
    side_effect_from_pb,
    side_effect_to_pb,
)

__all__ = ["encode_loose", "event_from_pb", "event_to_pb"]

_STREAM_TO_PB = {"stdout": pb.OUTPUT_STREAM_STDOUT, "stderr": pb.OUTPUT_STREAM_STDERR}
_STREAM_FROM_PB = {v: k for k, v in _STREAM_TO_PB.items()}
encode_loose = json.JSONEncoder(default=str).encode
"""``json.dumps(x, default=str)`` without building an encoder per call (once per event or result)."""
_REASON_TO_PB = {
    "client": pb.RESOLUTION_REASON_CLIENT,
    "remembered": pb.RESOLUTION_REASON_REMEMBERED,
    "timeout": pb.RESOLUTION_REASON_TIMEOUT,
    "cancelled": pb.RESOLUTION_REASON_CANCELLED,
}
_REASON_FROM_PB = {v: k for k, v in _REASON_TO_PB.items()}


def event_to_pb(event: Event) -> pb.Event:
    msg = pb.Event(
        seq=event.seq,
        session_id=event.session_id,
        turn_id=event.turn_id,
        tool_use_id=event.tool_use_id,
        type=event.type,
    )
    # Set directly: ``FromNanoseconds`` is pure Python in protobuf, and this runs once per event.
    seconds, nanos = divmod(int(event.time * 1e9), 1_000_000_000)
    msg.time.seconds = seconds
    msg.time.nanos = nanos
    match event.payload:
        case ep.ToolCalled() as p:
            msg.called.CopyFrom(
                pb.ToolCalled(
                    tool_name=p.tool_name,
                    side_effect=side_effect_to_pb(p.side_effect),
                    input_json=encode_loose(p.input),
                )
            )
        case ep.ToolOutputDelta() as p:
            stream = _STREAM_TO_PB.get(p.stream, pb.OUTPUT_STREAM_UNSPECIFIED)
            msg.output_delta.CopyFrom(pb.ToolOutputDelta(stream=stream, text=p.text))
        case ep.ToolCompleted() as p:
            msg.completed.CopyFrom(pb.ToolCompleted(tool_name=p.tool_name, duration_ms=p.duration_ms))
        case ep.ToolFailed() as p:
            msg.failed.CopyFrom(
                pb.ToolFailed(
                    tool_name=p.tool_name,
                    error_class=error_class_to_pb(p.error_class),
                    message=p.message,
                    duration_ms=p.duration_ms,
                    partial_output=p.partial_output,
                    reason=p.reason,
                )
            )
        case ep.ToolInputInvalid() as p:
            msg.input_invalid.CopyFrom(pb.ToolInputInvalid(tool_name=p.tool_name, errors=list(p.errors)))
        case ep.ToolConfirmationRequested() as p:
            msg.confirmation_requested.CopyFrom(
                pb.ToolConfirmationRequested(
                    request_id=p.request_id,
                    tool_name=p.tool_name,
                    input_summary=p.input_summary,
                    side_effect=side_effect_to_pb(p.side_effect),
                    projected_modifications=list(p.projected_modifications),
                    diff=p.diff,
                )
            )
        case ep.ToolStepProposed() as p:
            msg.step_proposed.CopyFrom(
                pb.ToolStepProposed(
                    step=p.step,
                    tool_name=p.tool_name,
                    input_summary=p.input_summary,
                    side_effect=side_effect_to_pb(p.side_effect),
                    projected_modifications=list(p.projected_modifications),
                )
            )
        case ep.StagedApplied() | ep.StagedDiscarded() as p:
            convert_staged.payload_to_pb(p, msg)
        case ep.ToolConfirmationResolved() as p:
            msg.confirmation_resolved.CopyFrom(
                pb.ToolConfirmationResolved(
                    request_id=p.request_id,
                    decision=decision_to_pb(p.decision),
                    reason=_REASON_TO_PB.get(p.reason, pb.RESOLUTION_REASON_UNSPECIFIED),
                )
            )
        case ep.SessionExpiring() | ep.SessionExpired() | ep.SessionPaused() | ep.SessionResumed() as p:
            cl.session_event_to_pb(msg, p)
        case ep.ProcessStarted() as p:
            msg.process_started.CopyFrom(
                pb.ProcessStarted(process_id=p.process_id, command=p.command, pid=p.pid, origin=p.origin)
            )
        case ep.ProcessExited() as p:
            msg.process_exited.CopyFrom(
                pb.ProcessExited(
                    process_id=p.process_id,
                    state=p.state,
                    exit_code=p.exit_code,
                    signal=p.signal,
                    output_bytes=p.output_bytes,
                )
            )
        case unknown:  # a new payload type: mypy names this line until it has its case
            assert_never(unknown)
    return msg


def event_from_pb(msg: pb.Event) -> Event | None:
    """The domain event the server published; None for one whose payload this client does not know
    (a newer server's event kind): a client skips it rather than lose the rest of the stream."""
    payload = _payload_from_pb(msg)
    if payload is None:
        return None
    return Event(
        seq=msg.seq,
        time=msg.time.ToNanoseconds() / 1e9,
        session_id=msg.session_id,
        turn_id=msg.turn_id,
        tool_use_id=msg.tool_use_id,
        payload=payload,
    )


def _payload_from_pb(msg: pb.Event) -> ep.EventPayload | None:
    kind = msg.WhichOneof("payload")
    if kind == "called":
        c = msg.called
        return ep.ToolCalled(
            tool_name=c.tool_name,
            side_effect=side_effect_from_pb(c.side_effect),
            input=json.loads(c.input_json) if c.input_json else None,
        )
    if kind == "output_delta":
        d = msg.output_delta
        return ep.ToolOutputDelta(stream=_STREAM_FROM_PB.get(d.stream, "stdout"), text=d.text)
    if kind == "completed":
        return ep.ToolCompleted(tool_name=msg.completed.tool_name, duration_ms=msg.completed.duration_ms)
    if kind == "failed":
        f = msg.failed
        return ep.ToolFailed(
            tool_name=f.tool_name,
            error_class=error_class_from_pb(f.error_class),
            message=f.message,
            duration_ms=f.duration_ms,
            partial_output=f.partial_output,
            reason=f.reason,
        )
    if kind == "input_invalid":
        return ep.ToolInputInvalid(
            tool_name=msg.input_invalid.tool_name, errors=tuple(msg.input_invalid.errors)
        )
    if kind == "confirmation_requested":
        r = msg.confirmation_requested
        return ep.ToolConfirmationRequested(
            request_id=r.request_id,
            tool_name=r.tool_name,
            input_summary=r.input_summary,
            side_effect=side_effect_from_pb(r.side_effect),
            projected_modifications=tuple(r.projected_modifications),
            diff=r.diff,
        )
    if kind == "step_proposed":
        sp = msg.step_proposed
        return ep.ToolStepProposed(
            step=sp.step,
            tool_name=sp.tool_name,
            input_summary=sp.input_summary,
            side_effect=side_effect_from_pb(sp.side_effect),
            projected_modifications=tuple(sp.projected_modifications),
        )
    if kind == "confirmation_resolved":
        s = msg.confirmation_resolved
        return ep.ToolConfirmationResolved(
            request_id=s.request_id,
            decision=decision_from_pb(s.decision),
            reason=_REASON_FROM_PB.get(s.reason, ""),
        )
    if kind in ("staged_applied", "staged_discarded"):
        return convert_staged.payload_from_pb(msg)
    if kind == "process_started":
        ps = msg.process_started
        return ep.ProcessStarted(process_id=ps.process_id, command=ps.command, pid=ps.pid, origin=ps.origin)
    if kind == "process_exited":
        px = msg.process_exited
        return ep.ProcessExited(
            process_id=px.process_id,
            state=px.state,
            exit_code=px.exit_code if px.HasField("exit_code") else None,
            signal=px.signal if px.HasField("signal") else None,
            output_bytes=px.output_bytes,
        )
    return cl.session_event_from_pb(msg)
