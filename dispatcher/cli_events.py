"""How the CLI shows an event: one human line (a confirmation request with its input, line by
line), or one JSON object."""

from __future__ import annotations

from typing import Any

from dispatcher.core import event_payloads as ep
from dispatcher.core.events import Event
from dispatcher.core.visible import visible


def describe(event: Event, prefix: str) -> str:
    """The line ``dispatcher call``/``watch`` prints for ``event`` (not for output deltas)."""
    p = event.payload
    if isinstance(p, ep.ToolCalled):
        return f"{p.tool_name} ({p.side_effect}) started"
    if isinstance(p, ep.ToolCompleted):
        return f"{p.tool_name} completed in {p.duration_ms:.1f} ms"
    if isinstance(p, ep.ToolFailed):
        return f"{p.tool_name} failed: {p.error_class}: {p.message}"
    if isinstance(p, ep.ToolInputInvalid):
        return f"{p.tool_name} input invalid: {'; '.join(p.errors)}"
    if isinstance(p, ep.ToolConfirmationRequested):
        return confirmation_lines(p, prefix)
    if isinstance(p, ep.ToolConfirmationResolved):
        return f"confirmation {p.request_id or '(remembered answer)'}: {p.decision} ({p.reason})"
    if isinstance(p, ep.ToolStepProposed):
        return f"{p.tool_name} ({p.side_effect}) held back as plan step {p.step}"
    return event.type


def confirmation_lines(p: ep.ToolConfirmationRequested, prefix: str) -> str:
    """A confirmation request: a line about it, then the input exactly as the server shows it.

    Every line of the input is marked with ``| `` so a reader sees where it starts and ends; the
    text goes through ``visible`` again in case a server sent control characters raw.
    """
    modifies = [visible(m, escape_backslash=True) for m in p.projected_modifications]
    head = (
        f"confirmation {p.request_id} requested for {p.tool_name} ({p.side_effect})"
        + (f" -> modifies {', '.join(modifies)}" if modifies else "")
        + ":"
    )
    shown = visible(p.input_summary, keep_newlines=True)
    text = head + "".join(f"\n{prefix}  | {line}" for line in shown.split("\n"))
    if p.diff:  # review mode: the staged change
        diff = visible(p.diff, keep_newlines=True).rstrip("\n")
        text += f"\n{prefix}  the change:" + "".join(f"\n{prefix}  | {line}" for line in diff.split("\n"))
    return text


def event_dict(event: Event) -> dict[str, Any]:
    """``--json``: the event as one object, its payload in the stored form (``to_dict``)."""
    return {
        "kind": "event",
        "seq": event.seq,
        "time": event.time,
        "session_id": event.session_id,
        "turn_id": event.turn_id,
        "tool_use_id": event.tool_use_id,
        "type": event.type,
        "payload": ep.to_dict(event.payload),
    }
