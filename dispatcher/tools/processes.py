"""The tools over a session's background processes (issue 32): ``process_list``,
``process_output``, ``process_input`` and ``process_stop``. ``shell {background: true}`` starts
them (``shell.py``); the sandbox's table runs them (``Sandbox.processes``, ``core/process_api.py``).

``process_output`` reads on, by default, from where this session's model last read
(``ToolContext.processes``): a model that polls sees each byte once. Every result is bounded:
``max_bytes`` of output at most (``MAX_READ_BYTES``), a listing's commands cut.
"""

from __future__ import annotations

import hashlib
import signal as signals
import time
from collections.abc import Sequence
from typing import Any

from dispatcher.core.errors import ToolCancelled
from dispatcher.core.process_api import (
    PROCESS_SIGNALS,
    OutputChunk,
    ProcessControl,
    ProcessError,
    ProcessInfo,
    ProcessOutput,
)
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput

PROCESS_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": "^[A-Za-z0-9_.-]{1,64}$",
    "description": "The process's id (p_...), as shell with background: true or process_list gave it.",
}
MAX_WAIT_SECONDS = 30.0
"""Longest ``wait_seconds`` of one read: well inside the 60 s limit of a READ call."""
HIDDEN_PREFIX = "code:"
"""Ids of the session's own workers (run_code's interpreters, ``tools/code/contexts.py``): not
listed to the model, and out of reach of these tools (their ids have no ``:``)."""
DEFAULT_READ_BYTES = 16 * 1024
MAX_READ_BYTES = 32 * 1024
"""Most output bytes one ``process_output`` returns: inside the dispatcher's result budget
(48,000 characters) with its headers, since a byte decodes to at most one character."""
MAX_INPUT_CHARS = 64 * 1024
DEFAULT_GRACE_SECONDS = 5.0
MAX_GRACE_SECONDS = 60.0
ENDING_SIGNALS = ("TERM", "INT", "HUP", "QUIT")
"""Signals a stop follows with ``KILL`` after the grace, when the process outlives them."""
COMMAND_SHOWN = 200
"""Characters of a command ``process_list`` shows."""
PKILL_WARNING = (
    "Do not use `pkill -f` (or `kill` on a `pgrep -f` match) with a pattern that matches your own "
    "command: it kills the shell running it."
)
HINTS = {
    "no_process": "use process_list to see this session's processes",
    "too_many": "stop one with process_stop first",
    "not_running": "process_list shows how it ended",
}


def process_id_for(tool_use_id: str, attempt: int = 0, *, salt: str = "") -> str:
    """The process id a call gives what it starts: derived from its ``tool_use_id``, so that the
    same call retried names the same process (and starts it once); short (8 hex digits), longer
    on a later ``attempt`` (when another call's process holds the short one)."""
    digest = hashlib.sha256(f"{salt}{tool_use_id}".encode("utf-8", "surrogatepass")).hexdigest()
    return "p_" + digest[: 8 + 8 * attempt]


def explained(exc: ProcessError) -> ProcessError:
    """``exc`` with what the model should do next, where there is something to do."""
    hint = HINTS.get(exc.code)
    if hint is None or hint in str(exc):
        return exc
    return ProcessError(exc.code, f"{exc}; {hint}", reason=exc.reason)


def control_of(context: ToolContext) -> ProcessControl:
    """The session's process table; a call cancelled already goes no further.

    Raises:
        ProcessError: ``unsupported``: this sandbox has none.
        ToolCancelled: the call was cancelled before it started.
    """
    if context.cancel_event.is_set():
        raise ToolCancelled("cancelled before it started")
    return context.sandbox.processes()


def how_it_ended(state: str, exit_code: int | None, signal: int | None) -> str:
    """``running``, ``exited (exit code 0)``, ``killed by signal 15 (SIGTERM)``..."""
    if state == "running":
        return "running"
    if signal is not None:
        try:
            name = f" ({signals.Signals(signal).name})"
        except ValueError:
            name = ""
        return f"{state} by signal {signal}{name}"
    if exit_code is not None:
        return f"{state} (exit code {exit_code})"
    return state


def _line(info: ProcessInfo, read: int, now: float) -> str:
    command = info.command.replace("\n", " ")
    if len(command) > COMMAND_SHOWN:
        command = command[:COMMAND_SHOWN] + f"... [{len(info.command) - COMMAND_SHOWN:,} more characters]"
    seconds = (info.ended if info.ended is not None else now) - info.started
    unread = max(info.end - max(read, info.first), 0)
    return (
        f"{info.process_id}  {how_it_ended(info.state, info.exit_code, info.signal)}  pid {info.pid}  "
        f"{max(seconds, 0):.0f} s  output {info.end:,} bytes, {unread:,} unread  "
        f"[{info.origin}]  cwd {info.cwd}  $ {command}"
    )


class ProcessTool:
    """Base of the process tools: a request to the table, finished once sent."""

    async def cancel(self) -> bool:
        return False


class ProcessListTool(ProcessTool):
    definition = ToolDefinition(
        name="process_list",
        description=(
            "List this session's background processes, one line each: id, state (running, exited "
            "with its code, killed by a signal), pid, how long it ran, output bytes and how many "
            "you have not read, how it started (background: shell with background: true; left: a "
            "shell command left it running), cwd and command. Finished processes stay listed and "
            "readable for a while (the last 64)."
        ),
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        side_effect=SideEffect.READ,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        control = control_of(context)
        try:
            infos = await control.list()
        except ProcessError as exc:
            raise explained(exc) from None
        infos = tuple(i for i in infos if not i.process_id.startswith(HIDDEN_PREFIX))
        memory = context.processes
        now = time.time()
        lines = [_line(i, memory.last_read(i.process_id) if memory else 0, now) for i in infos]
        running = sum(1 for i in infos if i.running)
        text = "\n".join(lines) if lines else "no processes in this session"
        return ToolOutput(
            [TextBlock(text)],
            metadata={"processes": len(infos), "running": running},
        )


class ProcessOutputTool(ProcessTool):
    definition = ToolDefinition(
        name="process_output",
        description=(
            "Read a background process's output (stdout and stderr, marked apart) and whether it is "
            "still running or how it ended. Without after, it reads on from where you last read "
            "this process (each byte once); after: a cursor from an earlier result (0: from the "
            "oldest byte kept). wait_seconds: wait up to that long for new output or the end when "
            "there is none yet (use it instead of sleep in a shell). The result gives the next "
            "cursor. Each process keeps its newest output (1 MiB by default): bytes it dropped "
            "before you read them are reported as '[... N bytes lost ...]'."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "process_id": PROCESS_ID_SCHEMA,
                "after": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Cursor to read from (default: where you last read this process).",
                },
                "wait_seconds": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_WAIT_SECONDS,
                    "description": (
                        f"Wait up to this long (at most {MAX_WAIT_SECONDS:g} s) for output or the end "
                        "when there is none yet (default 0: answer at once)."
                    ),
                },
                "max_bytes": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_READ_BYTES,
                    "description": (
                        f"Most output bytes to return (default {DEFAULT_READ_BYTES:,}, at most "
                        f"{MAX_READ_BYTES:,}); call again from the next cursor for more."
                    ),
                },
            },
            "required": ["process_id"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.READ,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        control = control_of(context)
        process_id: str = input["process_id"]
        memory = context.processes
        after = input.get("after")
        if after is None:
            after = memory.last_read(process_id) if memory is not None else 0
        max_bytes = int(input.get("max_bytes", DEFAULT_READ_BYTES))
        try:
            out = await control.read(
                process_id,
                after=int(after),
                wait_seconds=float(input.get("wait_seconds", 0.0)),
                max_bytes=max_bytes,
            )
        except ProcessError as exc:
            raise explained(exc) from None
        if memory is not None:
            memory.read_to(process_id, out.next)
        return render_output(process_id, int(after), out, max_bytes)


def render_output(process_id: str, after: int, out: ProcessOutput, max_bytes: int) -> ToolOutput:
    """A read as the model sees it: the output by stream, what was lost, the state, the cursor."""
    parts: list[str] = []
    if out.lost:
        parts.append(f"[... {out.lost:,} bytes lost: the process printed them before they were read ...]\n")
    sizes = {"stdout": 0, "stderr": 0}
    for stream, data in _runs(out.chunks):
        sizes[stream] += len(data)
        text = data.decode("utf-8", "replace")
        separator = "" if text.endswith("\n") else "\n"
        parts.append(f"[{stream}]\n{text}{separator}")
    if not out.chunks:
        parts.append("(no new output)\n")
    got = sum(sizes.values())
    more = " (more may wait: call again)" if got >= max_bytes else ""
    parts.append(
        f"[{process_id}: {how_it_ended(out.state, out.exit_code, out.signal)}; next cursor {out.next}{more}]"
    )
    metadata: dict[str, Any] = {
        "process_id": process_id,
        "after": after,
        "next": out.next,
        "lost": out.lost,
        "state": out.state,
        "stdout_bytes": sizes["stdout"],
        "stderr_bytes": sizes["stderr"],
    }
    if out.exit_code is not None:
        metadata["exit_code"] = out.exit_code
    if out.signal is not None:
        metadata["signal"] = out.signal
    return ToolOutput([TextBlock("".join(parts))], metadata=metadata)


def _runs(chunks: Sequence[OutputChunk]) -> list[tuple[str, bytes]]:
    """Consecutive chunks of one stream joined: the marks change only where the stream does."""
    runs: list[tuple[str, bytearray]] = []
    for chunk in chunks:
        if runs and runs[-1][0] == chunk.stream:
            runs[-1][1].extend(chunk.data)
        else:
            runs.append((chunk.stream, bytearray(chunk.data)))
    return [(stream, bytes(data)) for stream, data in runs]


class ProcessInputTool(ProcessTool):
    definition = ToolDefinition(
        name="process_input",
        description=(
            "Write text to a background process's stdin (a REPL, a prompt waiting for an answer); "
            "include the newline it expects. close_stdin: true closes it afterwards (end of input), "
            "data may then be empty. Then read the answer with process_output (wait_seconds helps). "
            "Input the process has not read yet is bounded (1 MiB by default)."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "process_id": PROCESS_ID_SCHEMA,
                "data": {
                    "type": "string",
                    "maxLength": MAX_INPUT_CHARS,
                    "description": f"The text to write (UTF-8; at most {MAX_INPUT_CHARS:,} characters).",
                },
                "close_stdin": {"type": "boolean", "description": "Close its stdin after writing."},
            },
            "required": ["process_id", "data"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.EXECUTE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        control = control_of(context)
        process_id: str = input["process_id"]
        data = str(input["data"]).encode("utf-8", "surrogatepass")
        close = bool(input.get("close_stdin", False))
        try:
            info = await control.write_input(process_id, data, close=close)
        except ProcessError as exc:
            raise explained(exc) from None
        text = f"wrote {len(data):,} bytes to the stdin of {process_id}" + (
            "; its stdin is closed" if close else ""
        )
        return ToolOutput(
            [TextBlock(f"{text}; read the answer with process_output")],
            metadata={"process_id": process_id, "bytes": len(data), "stdin_open": info.stdin_open},
        )


class ProcessStopTool(ProcessTool):
    definition = ToolDefinition(
        name="process_stop",
        description=(
            "Stop a background process and everything it started (its whole process group): "
            "SIGTERM, then SIGKILL if it is still running after grace_seconds (default "
            f"{DEFAULT_GRACE_SECONDS:g}). signal sends another one instead (KILL at once; INT, HUP, "
            "QUIT are followed by KILL like TERM; USR1 and USR2 are only sent). Its output stays "
            f"readable with process_output. {PKILL_WARNING} Use process_stop with the id from "
            "process_list instead."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "process_id": PROCESS_ID_SCHEMA,
                "signal": {
                    "type": "string",
                    "enum": list(PROCESS_SIGNALS),
                    "description": "The signal to send first (default TERM).",
                },
                "grace_seconds": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_GRACE_SECONDS,
                    "description": (
                        "How long to wait after TERM (INT, HUP, QUIT) before KILL (default "
                        f"{DEFAULT_GRACE_SECONDS:g}, at most {MAX_GRACE_SECONDS:g})."
                    ),
                },
            },
            "required": ["process_id"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.EXECUTE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        control = control_of(context)
        process_id: str = input["process_id"]
        name: str = input.get("signal", "TERM")
        grace = float(input.get("grace_seconds", DEFAULT_GRACE_SECONDS)) if name in ENDING_SIGNALS else None
        try:
            info = await control.signal(process_id, name, grace_seconds=grace)
        except ProcessError as exc:
            raise explained(exc) from None
        state = how_it_ended(info.state, info.exit_code, info.signal)
        return ToolOutput(
            [TextBlock(f"{process_id}: sent SIG{name}; now {state}")],
            metadata={"process_id": process_id, "signal": name, "state": info.state},
        )


PROCESS_TOOLS = (ProcessListTool, ProcessOutputTool, ProcessInputTool, ProcessStopTool)
