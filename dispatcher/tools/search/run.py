"""Runs ``program.py`` in a session's sandbox for ``glob`` and ``grep``, and reads its answer.

The program travels as the source of ``python3 -I -S -`` on stdin and its request as JSON in one
environment variable: the command line is a constant, so nothing the model writes is ever parsed
by a shell. Its answer is bounded by the program (results, line length) and again here (bytes
read); the call as a whole by the program's time bound and, behind it, the command's timeout.
"""

from __future__ import annotations

import asyncio
import functools
import json
from importlib import resources
from typing import Any

from dispatcher.core.errors import (
    FailureReason,
    ToolCancelled,
    ToolExecutionError,
    ToolTimeout,
    WorkspaceEscapeError,
)
from dispatcher.core.sandbox_api import ExecRequest, FileOpError, SandboxError
from dispatcher.core.types import ToolContext

COMMAND = "exec python3 -I -S -"
"""The whole command line: the program comes on stdin, the request in ``REQUEST_VAR``; isolated
(``-I``: no user site, no PYTHON* variables) and without ``site`` (``-S``: stdlib only, 2 ms less)."""
REQUEST_VAR = "DISPATCHER_SEARCH"
TIME_LIMIT = 30.0
"""Seconds a search walks before it stops and answers with what it found (the answer says so)."""
KILL_SLACK = 10.0
"""How much longer the command may run past the time limit before the sandbox kills it (a
pathological regex on one long line is not interrupted by the program's own bound)."""
DISPATCHER_SLACK = KILL_SLACK + 5.0
"""The tools' ``kill_slack_seconds``: they stop themselves (the program's bound within the call's
limit, then the command's kill), so the dispatcher waits this much past the limit before
abandoning the call: partial results come back rather than a bare timeout."""
MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""The program's answer is far smaller (its results are bounded); more is a broken program."""
MAX_LINE = 500
"""Characters of one matching line shown; the rest is cut with a marker."""


@functools.cache
def program() -> bytes:
    """The source of ``program.py``, read once."""
    return resources.files(__package__).joinpath("program.py").read_bytes()


class SearchTool:
    """Base of ``glob`` and ``grep``: a search can take seconds, so a cancel stops it."""

    def __init__(self) -> None:
        self._cancel = asyncio.Event()
        self._running = False

    async def cancel(self) -> bool:
        """Stop the running search (the sandbox kills its process)."""
        if not self._running:
            return False
        self._cancel.set()
        return True

    async def run(self, context: ToolContext, request: dict[str, Any]) -> dict[str, Any]:
        """``search``, stopped by this tool's cancel or the call's."""
        if context.cancel_event.is_set():
            raise ToolCancelled("cancelled before it started")
        relay = asyncio.ensure_future(self._relay(context.cancel_event))
        self._running = True
        try:
            return await search(context, self._cancel, request)
        finally:
            self._running = False
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)

    async def _relay(self, outer: asyncio.Event) -> None:
        await outer.wait()
        self._cancel.set()


async def where(context: ToolContext, path: str) -> str:
    """Where ``path`` is in the workspace (relative), as checked before the call or asked now.

    Raises:
        WorkspaceEscapeError: it resolves outside the workspace.
    """
    approved = context.resolved.get("path")
    return approved if approved is not None else await context.workspace_files.resolve(path)


async def search(context: ToolContext, cancel: asyncio.Event, request: dict[str, Any]) -> dict[str, Any]:
    """Run one search request in the sandbox and return the program's answer.

    Raises:
        ToolExecutionError: the program's error (a bad regex or glob, a missing path), or the
            sandbox could not run it (no ``python3`` in the image, the sandbox failed).
        ToolTimeout / ToolCancelled: the command was stopped.
    """
    time_limit = min(TIME_LIMIT, context.timeout_seconds or TIME_LIMIT)
    body = {
        **request,
        "root": context.workspace_files.workspace_root,
        "time_limit": time_limit,
        "max_line": MAX_LINE,
    }
    stdout = bytearray()
    stderr = bytearray()

    def on_output(stream: str, data: bytes) -> None:
        sink = stdout if stream == "stdout" else stderr
        room = (MAX_ANSWER_BYTES if stream == "stdout" else 8192) - len(sink)
        if room > 0:
            sink += data[:room]

    try:
        result = await context.sandbox.exec(
            ExecRequest(
                command=COMMAND,
                timeout=time_limit + KILL_SLACK,
                env={REQUEST_VAR: json.dumps(body)},
                stdin=program(),
                grace_seconds=1.0,
                tool_use_id=context.tool_use_id,
            ),
            on_output,
            cancel,
        )
    except SandboxError as exc:
        raise ToolExecutionError(
            f"the sandbox could not run the search: {exc}", exc, reason=FailureReason.SANDBOX_FAILED
        ) from exc
    if result.cancelled:
        raise ToolCancelled("search cancelled")
    if result.timed_out:
        raise ToolTimeout(
            f"the search ran past {time_limit + KILL_SLACK:g} s and was stopped (a regex that "
            "backtracks a lot on long lines can do this); simplify the pattern or narrow path/glob"
        )
    try:
        answer: dict[str, Any] = json.loads(bytes(stdout))
    except ValueError:
        tail = bytes(stderr).decode("utf-8", "replace").strip()[-1000:]
        if result.exit_code == 127 or "python3: not found" in tail:
            raise ToolExecutionError(
                "this sandbox image has no python3, which glob and grep run with; use shell"
            ) from None
        raise ToolExecutionError(
            f"the search failed in the sandbox (exit code {result.exit_code}): {tail or 'no output'}"
        ) from None
    error = answer.get("error")
    if error is not None:
        message = str(answer.get("message", error))
        if error == "escape":
            raise WorkspaceEscapeError(message)
        if error in ("ENOENT", "not_a_directory"):
            raise FileOpError(str(error), message)
        raise ToolExecutionError(message)
    answer["time_limit"] = time_limit  # what the notes of a stopped search name
    return answer
