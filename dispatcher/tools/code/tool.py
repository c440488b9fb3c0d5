"""``run_code {code, language?, context?, timeout_seconds?, restart?}``: run a cell in a live
interpreter of the session, its variables kept for the next call.

Why a worker of our own in the session's process table rather than a Jupyter kernel: nothing to
install in an image but ``python3`` (``node`` for JavaScript), no ZeroMQ ports in the sandbox, no
change to the in-sandbox agent (its process table already gives a process group, stdin, signals
and a bounded output ring that a watch follows), and a context ends with its sandbox like every
process of the session. ``contexts.py`` names and bounds the workers; ``frames.py`` tells their
frames from a cell's output; ``result.py`` renders a cell.

A timeout or a cancel interrupts the cell (SIGINT to the worker's group: KeyboardInterrupt in
Python, a broken script in Node) and keeps the context; a cell that does not stop within
``INTERRUPT_GRACE`` seconds more has its worker killed and a fresh context started, and the result
says so. Cells of one context run one at a time, in the order they came.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from dispatcher.core.errors import ToolCancelled, ToolExecutionError, ToolTimeout
from dispatcher.core.process_api import CodeContext, OutputChunk, ProcessControl, ProcessError, ProcessInfo
from dispatcher.core.types import SideEffect, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools.code import contexts
from dispatcher.tools.code.contexts import Language, marker_of
from dispatcher.tools.code.frames import FrameError, FrameReader, Output
from dispatcher.tools.code.result import Cell, render
from dispatcher.tools.processes import control_of, how_it_ended
from dispatcher.tools.text import DeltaEmitter

DEFAULT_TIMEOUT = 600.0
MAX_TIMEOUT = 600.0
MAX_CODE_CHARS = 100_000
"""A cell's code: its request (JSON, UTF-8) stays well inside the table's stdin bound (1 MiB)."""
INTERRUPT_GRACE = 3.0
"""After SIGINT, how long a cell has to stop before its worker is killed and started afresh."""
KILL_SLACK = INTERRUPT_GRACE + 12.0
"""The dispatcher waits this much past the limit: the interrupt, the kill and the new start."""
_LOCKS: weakref.WeakValueDictionary[tuple[str, str, str], asyncio.Lock] = weakref.WeakValueDictionary()
"""One lock per (session, language, context) while a call holds or waits for it."""


class WorkerEnded(Exception):
    """The worker ended during the cell."""

    def __init__(self, info: ProcessInfo) -> None:
        super().__init__(info.process_id)
        self.info = info


class RunCodeTool:
    """Runs one cell; a fresh instance per call. ``max_contexts`` and ``idle_seconds`` bound a
    session's contexts (``tools.run_code``)."""

    definition = ToolDefinition(
        name="run_code",
        description=(
            "Run code in a live interpreter of this session, like a notebook cell: variables, "
            "imports, functions and the working directory persist from one call to the next in the "
            "same context. language: python (default; numpy, pandas and matplotlib where the image "
            "has them) or javascript (Node). The result gives what the cell printed (stdout, then "
            "[stderr]), the value of its last expression, matplotlib figures left open or shown as "
            "PNG images, and an error with its traceback. context names another interpreter "
            "(default: one per language); contexts do not share variables. restart: true starts the "
            "context afresh (everything in it is forgotten). A timeout or a cancel interrupts the "
            "cell (KeyboardInterrupt) and keeps the context; if the cell does not stop, the context "
            "is restarted and the result says so. Idle contexts end after a while, and a session "
            "has a few at most. The code runs in the workspace (cwd) with the sandbox's network."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "code": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_CODE_CHARS,
                    "description": "The cell's code.",
                },
                "language": {
                    "type": "string",
                    "enum": list(contexts.LANGUAGES),
                    "description": "python (default) or javascript.",
                },
                "context": {
                    "type": "string",
                    "pattern": "^[A-Za-z0-9_-]{1,32}$",
                    "description": "Which interpreter of this language (default: default).",
                },
                "timeout_seconds": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": MAX_TIMEOUT,
                    "description": "Interrupt the cell after this many seconds (default: the server's limit).",
                },
                "restart": {
                    "type": "boolean",
                    "description": "Start the context afresh before the cell: its variables are forgotten.",
                },
            },
            "required": ["code"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.EXECUTE,
        kill_slack_seconds=KILL_SLACK,
    )

    def __init__(
        self,
        max_contexts: int = contexts.DEFAULT_MAX_CONTEXTS,
        idle_seconds: float = contexts.DEFAULT_IDLE_SECONDS,
    ) -> None:
        self.max_contexts = max_contexts
        self.idle_seconds = idle_seconds
        self._cancel = asyncio.Event()
        self._running = False

    async def cancel(self) -> bool:
        """Interrupt the running cell (the context stays)."""
        if not self._running:
            return False
        self._cancel.set()
        return True

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Run the cell; an error, a timeout and a cancel raise with the cell's output attached."""
        code = str(input["code"])
        language = cast(Language, input.get("language", "python"))
        name = contexts.check_name(str(input.get("context", contexts.DEFAULT_CONTEXT)))
        limit = context.timeout_seconds or DEFAULT_TIMEOUT
        timeout = min(float(input.get("timeout_seconds", limit)), limit)
        control = control_of(context)
        key = (context.session_id, language, name)
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = asyncio.Lock()
        async with lock:
            if context.cancel_event.is_set():
                raise ToolCancelled("cancelled before the cell ran")
            notes: list[str] = []
            ctx = await contexts.find(control, language, name)
            if ctx is not None and input.get("restart"):
                await contexts.remove(control, ctx)
                ctx = None
                notes.append("restarted: a fresh context, earlier variables are gone")
            fresh = ctx is None
            if ctx is None:
                ctx = await self._start(control, language, name, context)
            return await self._cell(control, ctx, code, timeout, context, notes, fresh=fresh)

    async def _start(
        self, control: ProcessControl, language: Language, name: str, context: ToolContext
    ) -> CodeContext:
        try:
            return await contexts.start(
                control,
                language,
                name,
                max_contexts=self.max_contexts,
                idle_seconds=self.idle_seconds,
                tool_use_id=context.tool_use_id,
            )
        except ProcessError as exc:
            raise ProcessError(
                exc.code, f"cannot start a {language} context: {exc}", reason=exc.reason
            ) from None

    async def _cell(
        self,
        control: ProcessControl,
        ctx: CodeContext,
        code: str,
        timeout: float,
        context: ToolContext,
        notes: list[str],
        *,
        fresh: bool,
    ) -> ToolOutput:
        cell = Cell()
        deltas = DeltaEmitter(context.emit_output)
        cell_id = secrets.token_hex(8)
        started = time.monotonic()
        after = 0 if fresh else ctx.info.end
        self._running = True
        follow = asyncio.ensure_future(self._follow(control, ctx, cell_id, after, cell, deltas))
        stop = asyncio.ensure_future(_first(context.cancel_event, self._cancel))
        why: str | None = None
        try:
            request = json.dumps({"id": cell_id, "code": code}) + "\n"  # ASCII: at most 6 bytes a character
            try:
                await control.write_input(ctx.process_id, request.encode("utf-8", "surrogatepass"))
            except ProcessError as exc:
                if exc.code != "not_running":
                    raise
                # It ended already: the watch ends with its record, and the result says how.
            await asyncio.wait((follow, stop), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not follow.done():
                why = "cancelled" if stop.done() else f"timed out after {timeout:g} s"
                await _interrupt(control, ctx)
                await asyncio.wait((follow,), timeout=INTERRUPT_GRACE)
            if not follow.done():
                follow.cancel()
                await asyncio.gather(follow, return_exceptions=True)
                await contexts.remove(control, ctx)
                notes.append(
                    f"the cell did not stop within {INTERRUPT_GRACE:g} s of the interrupt: its context "
                    "was killed and a fresh one started (earlier variables are gone)"
                )
                await self._start(control, ctx.language, ctx.name, context)
            else:
                follow.result()  # a WorkerEnded or a FrameError is the call's
        except asyncio.CancelledError:
            # Abandoned by the dispatcher: the cell must not run on, holding the next ones.
            await asyncio.shield(_interrupt(control, ctx))
            raise
        except WorkerEnded as ended:
            raise self._ended(ended.info, cell, notes, fresh=fresh, language=ctx.language) from None
        except FrameError as exc:
            await contexts.remove(control, ctx)
            raise ToolExecutionError(f"the {ctx.language} context broke and was removed: {exc}") from None
        finally:
            self._running = False
            stop.cancel()
            if not follow.done():
                follow.cancel()
            deltas.close()
        metadata: dict[str, Any] = {
            "language": ctx.language,
            "context": ctx.name,
            "duration_ms": round((time.monotonic() - started) * 1000, 1),
        }
        if why is not None:
            metadata["interrupted"] = True
            if cell.done is not None:
                notes.append(f"{why}: the cell was interrupted; the context and its variables are kept")
        output, failure = render(cell, notes, metadata)
        if why is not None and why.startswith("timed out"):
            raise ToolTimeout(f"cell {why}", output=output)
        if why is not None:
            raise ToolCancelled("cell cancelled", output=output)
        if failure is not None:
            raise ToolExecutionError(f"{failure['name']}: {failure['value']}"[:500], output=output)
        return output

    async def _follow(
        self,
        control: ProcessControl,
        ctx: CodeContext,
        cell_id: str,
        after: int,
        cell: Cell,
        deltas: DeltaEmitter,
    ) -> None:
        """Read the worker's output until the cell's ``done`` frame, continuously (its ring is
        bounded): the cell's output to ``cell`` and the deltas, its answer to ``cell.done``.

        Raises:
            WorkerEnded: the worker ended first.
            FrameError: it sent something that is not a frame.
        """
        readers = {"stdout": FrameReader(marker_of(ctx)), "stderr": FrameReader(marker_of(ctx))}
        buffers = {"stdout": cell.stdout, "stderr": cell.stderr}
        mine: set[str] = set()
        ended: set[str] = set()
        async with contextlib.aclosing(_items(control.watch(ctx.process_id, after=after))) as items:
            async for item in items:
                if isinstance(item, ProcessInfo):
                    for stream, reader in readers.items():
                        if stream in mine and stream not in ended:
                            buffers[stream].feed(reader.rest())
                    raise WorkerEnded(item)
                cell.lost += item.lost
                stream = item.stream
                for part in readers[stream].feed(item.data):
                    if isinstance(part, Output):
                        if stream in mine and stream not in ended:
                            buffers[stream].feed(part.data)
                            await _room(deltas.feed(stream, part.data))
                    elif part.message.get("id") == cell_id:
                        if part.type == "start":
                            mine.add(stream)
                        elif part.type == "done":
                            cell.done = part.message
                            ended.add(stream)
                        elif part.type == "end":
                            ended.add(stream)
                if len(ended) == 2 and cell.done is not None:
                    return

    def _ended(
        self, info: ProcessInfo, cell: Cell, notes: list[str], *, fresh: bool, language: Language
    ) -> ToolExecutionError:
        how = how_it_ended(info.state, info.exit_code, info.signal)
        if fresh and info.exit_code in (126, 127):
            program = contexts.PROGRAMS[language].split()[0]
            what = f"the {language} interpreter could not start ({how}): does the image have {program} on its PATH?"
        else:
            what = f"the {language} context ended during the cell ({how}); the next call starts a fresh one"
        notes.append(what)
        output, _ = render(cell, notes, {"language": language})
        output.success = False
        return ToolExecutionError(what, output=output)


async def _items(
    watch: AsyncIterator[OutputChunk | ProcessInfo],
) -> AsyncGenerator[OutputChunk | ProcessInfo, None]:
    """The watch, closed however its reader stops."""
    try:
        async for item in watch:
            yield item
    finally:
        if isinstance(watch, AsyncGenerator):  # the contract's watch: closing it stops it
            await watch.aclose()


async def _room(future: asyncio.Future[None] | None) -> None:
    if future is not None:
        await future


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _interrupt(control: ProcessControl, ctx: CodeContext) -> None:
    with contextlib.suppress(ProcessError):
        await control.signal(ctx.process_id, "INT")
