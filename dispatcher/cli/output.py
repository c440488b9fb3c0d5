"""What the CLI prints: its exit codes, and events and results as human lines (a confirmation
request with its input, line by line) or as one JSON object each (``--json``)."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from dispatcher.core.events import payloads as ep
from dispatcher.core.events.bus import Event
from dispatcher.core.text.visible import visible
from dispatcher.core.types import ImageBlock, TextBlock, ToolResultBlock

EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
EXIT_BY_CODE = {
    "UNAVAILABLE": 3,
    "DEADLINE_EXCEEDED": 3,
    "UNAUTHENTICATED": 4,
    "NOT_FOUND": 5,
    "INVALID_ARGUMENT": 6,
    "RESOURCE_EXHAUSTED": 7,
}
EXIT_OTHER_REQUEST_ERROR = 8
EXIT_INTERRUPTED = 130


def describe(event: Event, prefix: str) -> str:
    """The line ``dispatcher call``/``watch`` prints for ``event`` (not for output deltas)."""
    p = event.payload
    if isinstance(p, ep.ToolCalled):
        return f"{p.tool_name} ({p.side_effect}) started"
    if isinstance(p, ep.ToolCompleted):
        return f"{p.tool_name} completed in {p.duration_ms:.1f} ms"
    if isinstance(p, ep.ToolFailed):
        return f"{p.tool_name} failed: {p.error_class}{f' ({p.reason})' if p.reason else ''}: {p.message}"
    if isinstance(p, ep.ToolInputInvalid):
        return f"{p.tool_name} input invalid: {'; '.join(p.errors)}"
    if isinstance(p, ep.ToolConfirmationRequested):
        return confirmation_lines(p, prefix)
    if isinstance(p, ep.ToolConfirmationResolved):
        return f"confirmation {p.request_id or '(remembered answer)'}: {p.decision} ({p.reason})"
    if isinstance(p, ep.ToolStepProposed):
        return f"{p.tool_name} ({p.side_effect}) held back as plan step {p.step}"
    if isinstance(p, ep.StagedApplied):
        refused = f"; refused: {', '.join(p.refused_ids)}" if p.refused_ids else ""
        return f"staged changes applied: {', '.join(p.change_ids) or 'none'}{refused}"
    if isinstance(p, ep.StagedDiscarded):
        return f"staged changes discarded: {', '.join(p.change_ids) or 'none'}"
    if isinstance(p, ep.ProcessStarted):
        how = "left running by a foreground command" if p.origin == "left" else "started in the background"
        return f"process {p.process_id} {how} (pid {p.pid}): {visible(p.command, escape_backslash=True)}"
    if isinstance(p, ep.ProcessExited):
        status = f"signal {p.signal}" if p.signal is not None else f"exit code {p.exit_code}"
        if p.signal is None and p.exit_code is None:
            status = "its group is empty"
        return f"process {p.process_id} {p.state} ({status}), {p.output_bytes:,} bytes of output"
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


class CallPrinter:
    """Human or JSON-lines rendering of events and results; shell output is streamed as it comes."""

    def __init__(self, as_json: bool, out: TextIO, err: TextIO) -> None:
        self._json = as_json
        self._out = out
        self._err = err
        self._streamed: set[str] = set()

    def event(self, event: Event, *, watching: bool = False) -> None:
        if self._json:
            json_line(event_dict(event), self._out)
            return
        p = event.payload
        if isinstance(p, ep.ToolOutputDelta):
            self._streamed.add(event.tool_use_id)
            (self._err if p.stream == "stderr" and not watching else self._out).write(p.text)
            self._out.flush()
            return
        prefix = f"[{event.seq}] {event.tool_use_id} " if watching else "  "
        line = describe(event, prefix)
        print(prefix + line, file=self._out if watching else self._err, flush=True)

    def result(self, result: ToolResultBlock) -> None:
        if self._json:
            json_line(result_dict(result), self._out)
            return
        streamed = result.tool_use_id in self._streamed
        for block in result.content:
            if isinstance(block, ImageBlock):
                print(f"[image {block.media_type}, {len(block.data)} bytes]", file=self._out)
            elif not streamed:
                text = block.text
                self._out.write(text if text.endswith("\n") else text + "\n")
        if streamed:
            # The output went by as deltas; what happened to the sandbox (recreated, resumed,
            # leftovers killed) is only in the result: a person must see it too.
            for notice in result.metadata.get("sandbox_notices") or ():
                print(f"  [sandbox: {notice}]", file=self._err)
        if "exit_code" in result.metadata:
            print(f"  exit code {result.metadata['exit_code']}", file=self._err)
        if result.is_error:
            print(
                f"  error: {result.error_class}{f' ({result.reason})' if result.reason else ''}",
                file=self._err,
            )
        self._out.flush()


def json_line(obj: Any, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(json.dumps(obj, default=str, ensure_ascii=False) + "\n")
    out.flush()


def result_dict(result: ToolResultBlock) -> dict[str, Any]:
    return {
        "kind": "result",
        "tool_use_id": result.tool_use_id,
        "is_error": result.is_error,
        "error_class": result.error_class,
        "reason": result.reason,
        "content": [
            {"type": "text", "text": b.text}
            if isinstance(b, TextBlock)
            else {"type": "image", "media_type": b.media_type, "bytes": len(b.data)}
            for b in result.content
        ],
        "metadata": dict(result.metadata),
        "files_modified": list(result.files_modified),
        "command_executed": result.command_executed,
    }
