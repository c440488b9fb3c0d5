"""A Dispatch whose client does not read holds a bounded number of bytes (issue 7, point 5), and
its output waits for the client rather than being skipped (issue 37, item 1)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Coroutine
from pathlib import Path
from typing import Any, cast

from dispatcher.core import DispatcherConfig, Session, ToolDispatcher
from dispatcher.core.events.bus import DEFAULT_MAX_BYTES, Event
from dispatcher.core.events.payloads import ToolOutputDelta
from dispatcher.core.types import (
    ImageBlock,
    SideEffect,
    TextBlock,
    ToolContext,
    ToolDefinition,
    ToolOutput,
    ToolResultBlock,
    ToolUseBlock,
)
from dispatcher.sandbox.fake import FakeSandboxProvider
from dispatcher.server.sessions.dispatch_stream import DispatchCall
from tests.blocks import text_at
from tests.server.helpers import until

RESULT_BUDGET = 100_000
PENDING = 400_000


class ImageTool:
    """NONE: returns a 90 kB image (most of what one result may carry)."""

    definition = ToolDefinition("image", "An image.", {"type": "object"}, SideEffect.NONE)

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([ImageBlock(b"\x89PNG\r\n\x1a\n" + b"\0" * 90_000, "image/png")])

    async def cancel(self) -> bool:
        return False


def _call(tmp_path: Path, n: int) -> tuple[ToolDispatcher, DispatchCall]:
    dispatcher = ToolDispatcher(
        FakeSandboxProvider(), config=DispatcherConfig(result_budget_bytes=RESULT_BUDGET)
    )
    dispatcher.register(ImageTool)
    session = Session("s1", str(tmp_path), "t1")
    dispatcher.open_session(session)
    background: list[asyncio.Task[None]] = []

    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        background.append(asyncio.ensure_future(coro))

    uses = [ToolUseBlock(f"u{i}", "image", {}) for i in range(n)]
    return dispatcher, DispatchCall(dispatcher, session, "t", uses, spawn=spawn, pending_bytes=PENDING)


async def test_a_client_that_does_not_read_holds_at_most_the_budget(tmp_path: Path) -> None:
    dispatcher, call = _call(tmp_path, 40)
    items = call.items()
    await anext(items)  # the stream starts; the client then stops reading
    await until(lambda: call.running == 0)  # everything started has finished
    assert call.started < 40  # the rest wait for the client
    assert call.held_bytes <= PENDING
    results = 0
    async for item in items:  # the client reads again: the rest start, nothing is lost
        assert call.held_bytes <= PENDING + RESULT_BUDGET
        results += isinstance(item, ToolResultBlock)
    assert results == 40 and call.started == 40
    await dispatcher.aclose()


async def test_results_of_a_reading_client_arrive_as_before(tmp_path: Path) -> None:
    dispatcher, call = _call(tmp_path, 10)
    seen = [i.tool_use_id for i in [x async for x in call.items()] if isinstance(i, ToolResultBlock)]
    assert sorted(seen) == sorted(f"u{i}" for i in range(10))
    await dispatcher.aclose()


async def test_waiting_tool_uses_start_when_the_session_is_cancelled(tmp_path: Path) -> None:
    dispatcher, call = _call(tmp_path, 40)
    items = call.items()
    await anext(items)
    await until(lambda: call.running == 0)
    call.start_all()  # what the dispatcher does before cancelling the session's calls
    assert call.started == 40
    results = [i async for i in items if isinstance(i, ToolResultBlock)]
    assert len(results) == 40  # nothing was lost while they waited
    await dispatcher.aclose()


async def test_a_dispatch_that_raises_still_answers_its_tool_use_once(tmp_path: Path) -> None:
    # A core bug (the dispatch raising instead of returning a result), at once or after a wait:
    # each tool_use still gets exactly one error result, after the events it had.
    dispatcher, call = _call(tmp_path, 2)
    gate = asyncio.Event()

    async def broken(tool_use: ToolUseBlock, session: Session, **kw: Any) -> ToolResultBlock:
        if tool_use.id == "u1":
            await gate.wait()
        raise RuntimeError("core bug")

    dispatcher.dispatch = broken  # type: ignore[method-assign]
    items = call.items()
    first = await anext(items)
    gate.set()
    results = [first, *[x async for x in items]]
    assert [r.tool_use_id for r in results] == ["u0", "u1"]
    for result in results:
        assert isinstance(result, ToolResultBlock) and result.is_error
        assert result.error_class is not None and result.error_class.value == "execution_error"
        assert "internal error in the dispatcher" in text_at(result)
    await dispatcher.aclose()


CHUNK_TEXT = "0123456789abcdef" * 4096  # 64 KiB, as the agent sends a command's output
CHUNKS = 48  # 3 MiB


class PrinterTool:
    """NONE: prints 3 MiB through ``emit_output``, waiting whenever the caller's stream is full,
    as a command's output stream does (``sandbox/agent_link.py``)."""

    definition = ToolDefinition("printer", "Prints.", {"type": "object"}, SideEffect.NONE)
    printed = 0
    waiting: asyncio.Future[None] | None = None

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        for _ in range(CHUNKS):
            room = context.emit_output("stdout", CHUNK_TEXT)
            PrinterTool.printed += 1
            if room is not None:
                PrinterTool.waiting = room
                await room
                PrinterTool.waiting = None
        return ToolOutput([TextBlock("printed")])

    async def cancel(self) -> bool:
        return False


def _printer_call(tmp_path: Path) -> tuple[ToolDispatcher, DispatchCall]:
    PrinterTool.printed, PrinterTool.waiting = 0, None
    dispatcher = ToolDispatcher(
        FakeSandboxProvider(), config=DispatcherConfig(result_budget_bytes=RESULT_BUDGET)
    )
    dispatcher.register(PrinterTool)
    session = Session("s1", str(tmp_path), "t1")
    dispatcher.open_session(session)
    uses = [ToolUseBlock("p", "printer", {})]
    return dispatcher, DispatchCall(dispatcher, session, "t", uses, spawn=asyncio.ensure_future)


async def test_a_caller_that_stops_reading_stops_the_output_and_then_gets_every_byte(tmp_path: Path) -> None:
    dispatcher, call = _printer_call(tmp_path)
    items = call.items()
    await anext(items)  # tool.called; the client then stops reading
    await until(lambda: PrinterTool.waiting is not None)
    assert PrinterTool.printed < CHUNKS  # the output waits for the caller ...
    assert call.held_bytes <= DEFAULT_MAX_BYTES + 2 * len(CHUNK_TEXT) + RESULT_BUDGET  # ... bounded
    text: list[str] = []
    async for item in items:  # the client reads again: everything, nothing skipped
        if isinstance(item, Event) and isinstance(item.payload, ToolOutputDelta):
            text.append(item.payload.text)
    assert "".join(text) == CHUNK_TEXT * CHUNKS and PrinterTool.printed == CHUNKS
    await dispatcher.aclose()


async def test_a_caller_gone_lets_waiting_output_go_on(tmp_path: Path) -> None:
    dispatcher, call = _printer_call(tmp_path)
    items = call.items()
    await anext(items)
    await until(lambda: PrinterTool.waiting is not None)
    room = PrinterTool.waiting
    assert room is not None
    await cast(AsyncGenerator[Any, None], items).aclose()  # the client went away
    assert room.done()  # nothing waits for a reader that is gone (the call is cancelled too)
    await dispatcher.aclose()
