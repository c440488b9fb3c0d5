"""``run_code`` on the local sandbox: real workers (the host's python3 and node) in the agent's
process table, the same program the containers get."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import shutil
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.blocks import ImageBlock
from dispatcher.core.errors import ToolCancelled, ToolError, ToolExecutionError, ToolTimeout
from dispatcher.core.process_api import ProcessError
from dispatcher.core.types import ToolContext, ToolOutput
from dispatcher.sandbox.fake.processes import Limits
from dispatcher.sandbox.local import LocalSandbox
from dispatcher.tools.code import RunCodeTool, contexts, tool
from dispatcher.tools.code.result import MAX_IMAGES, Cell, render
from dispatcher.tools.processes import ProcessListTool
from tests.polling import until

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="no node on this host")


class Caller:
    """Calls tools on one session of a local sandbox, each call a fresh tool."""

    def __init__(self, sandbox: LocalSandbox, workspace: Path) -> None:
        self.sandbox = sandbox
        self.workspace = workspace
        self.deltas: list[tuple[str, str]] = []
        self.calls = 0

    def context(self) -> ToolContext:
        self.calls += 1
        return ToolContext(
            session_id="s1",
            turn_id="t1",
            tool_use_id=f"tu{self.calls}",
            workspace_path=str(self.workspace),
            cancel_event=asyncio.Event(),
            logger=logging.LoggerAdapter(logging.getLogger("test")),
            workspace_files=self.sandbox,
            sandbox=self.sandbox,
            emit_output=self.emit,
        )

    def emit(self, stream: str, text: str) -> None:
        self.deltas.append((stream, text))

    async def run(self, code: str, tool_: RunCodeTool | None = None, **input: Any) -> ToolOutput:
        return await (tool_ or RunCodeTool()).execute({"code": code, **input}, self.context())

    async def fails(self, code: str, error: type[ToolError] = ToolExecutionError, **input: Any) -> ToolOutput:
        with pytest.raises(error) as info:
            await self.run(code, **input)
        assert info.value.output is not None
        return info.value.output


@pytest.fixture
async def caller(workspace: Path) -> AsyncIterator[Caller]:
    sandbox = LocalSandbox(str(workspace), kill_wait=1.0)
    try:
        yield Caller(sandbox, workspace)
    finally:
        await sandbox.aclose()


def _text(output: ToolOutput) -> str:
    first = output.content[0]
    assert not isinstance(first, ImageBlock)
    return first.text


async def test_variables_live_from_one_call_to_the_next(caller: Caller) -> None:
    first = await caller.run("x = 41\nprint('hi')\nimport sys; print('oops', file=sys.stderr)")
    assert _text(first) == "hi\n[stderr]\noops"
    assert first.metadata["stdout_bytes"] == 3 and first.metadata["stderr_bytes"] == 5
    assert ("stdout", "hi\n") in caller.deltas and ("stderr", "oops\n") in caller.deltas
    second = await caller.run("x + 1")
    assert _text(second) == "42"
    assert second.metadata["execution_count"] == 2 and second.metadata["mime_types"] == ["text/plain"]


async def test_the_working_directory_persists_too(caller: Caller) -> None:
    (caller.workspace / "sub").mkdir()
    await caller.run("import os; os.chdir('sub')")
    assert _text(await caller.run("os.getcwd()")) == repr(str(caller.workspace / "sub"))


async def test_an_error_names_the_cells_line_and_keeps_the_context(caller: Caller) -> None:
    await caller.run("x = 41")
    out = await caller.fails("y = 2\ndef f():\n    return 1 / 0\nf()")
    text = _text(out)
    assert 'File "<cell 2>", line 4' in text and 'File "<cell 2>", line 3, in f' in text
    assert text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "<run_code worker>" not in text  # the worker's own frames are trimmed
    assert out.metadata["error"] == {"name": "ZeroDivisionError", "value": "division by zero"}
    assert not out.success
    assert _text(await caller.run("x, y")) == "(41, 2)"


async def test_a_timeout_interrupts_the_cell_and_keeps_the_context(caller: Caller) -> None:
    await caller.run("x = 41")
    out = await caller.fails("while True: pass", ToolTimeout, timeout_seconds=0.5)
    assert "KeyboardInterrupt" in _text(out) and "context and its variables are kept" in _text(out)
    assert out.metadata["interrupted"] is True
    assert _text(await caller.run("x")) == "41"


async def test_a_cell_that_ignores_the_interrupt_is_killed_and_its_context_started_afresh(
    caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool, "INTERRUPT_GRACE", 0.5)
    await caller.run("x = 41")
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: time.sleep(0.05)"
    out = await caller.fails(code, ToolTimeout, timeout_seconds=0.5)
    assert "its context was killed and a fresh one started" in _text(out)
    out = await caller.fails("x")
    assert out.metadata["error"]["name"] == "NameError"
    live = await contexts.list_contexts(caller.sandbox.processes())
    assert [(c.name, c.generation) for c in live] == [("default", 2)]


async def test_restart_forgets_and_contexts_do_not_share(caller: Caller) -> None:
    await caller.run("x = 41")
    await caller.run("x = 1", context="other")
    assert _text(await caller.run("x")) == "41"
    assert _text(await caller.run("x", context="other")) == "1"
    out = await caller.fails("x", restart=True)
    assert "restarted" in _text(out) and out.metadata["execution_count"] == 1


async def test_the_sessions_contexts_are_bounded(caller: Caller) -> None:
    two = RunCodeTool(max_contexts=2)
    await caller.run("1", two, context="a")
    await caller.run("1", two, context="b")
    with pytest.raises(ProcessError) as info:
        await caller.run("1", two, context="c")
    assert info.value.code == "too_many" and "python:a, python:b" in str(info.value)
    await caller.run("2", two, context="a")  # an existing one still runs
    await contexts.remove(
        caller.sandbox.processes(), (await contexts.list_contexts(caller.sandbox.processes()))[0]
    )
    await caller.run("1", two, context="c")


async def test_an_idle_context_ends_by_itself(caller: Caller) -> None:
    await caller.run("x = 1", RunCodeTool(idle_seconds=0.3))
    control = caller.sandbox.processes()

    async def gone() -> bool:
        return not await contexts.list_contexts(control)

    await until(gone, what="the idle worker's end", timeout=10)
    out = await caller.fails("x")
    assert out.metadata["error"]["name"] == "NameError"


async def test_the_workers_are_not_in_process_list(caller: Caller) -> None:
    await caller.run("1")
    listed = await ProcessListTool().execute({}, caller.context())
    assert _text(listed) == "no processes in this session"
    assert [i.process_id for i in await caller.sandbox.processes().list()] == ["code:python:default:1"]


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


async def test_rich_values_come_with_their_types_and_images_as_blocks(caller: Caller) -> None:
    png = _png(3, 2)
    code = (
        "class Shown:\n"
        "    def _repr_html_(self): return '<b>hi</b>'\n"
        f"    def _repr_png_(self): return {png!r}\n"
        "    def __repr__(self): return 'Shown()'\n"
        "Shown()"
    )
    out = await caller.run(code)
    assert _text(out) == "[text/html]\n<b>hi</b>\n[value]\nShown()"
    assert out.metadata["mime_types"] == ["text/html", "text/plain", "image/png"]
    assert out.content[1] == ImageBlock(png, "image/png")


async def test_output_is_bounded_and_counted(caller: Caller) -> None:
    out = await caller.run("print('x' * 1_000_000)\n'done'")
    assert out.metadata["stdout_bytes"] == 1_000_001
    assert len(_text(out)) < 48_000 and _text(out).endswith("[value]\n'done'")
    assert "bytes of output omitted" in _text(out)


async def test_an_image_without_the_interpreter_is_told_what_it_needs(
    caller: Caller, monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstraps = dict(contexts._BOOTSTRAPS, python="no-such-python3 -c pass")
    monkeypatch.setattr(contexts, "_BOOTSTRAPS", bootstraps)
    out = await caller.fails("1")
    assert "does the image have python3 on its PATH?" in _text(out)


@needs_node
async def test_javascript_keeps_its_variables_and_is_interrupted(caller: Caller) -> None:
    first = await caller.run("var x = 41; let y = 1; console.log('hi'); x", language="javascript")
    assert _text(first) == "hi\n[value]\n41"
    assert _text(await caller.run("x + y", language="javascript")) == "42"
    out = await caller.fails("while (true) {}", ToolTimeout, language="javascript", timeout_seconds=0.5)
    assert out.metadata["interrupted"] is True
    assert _text(await caller.run("x", language="javascript")) == "41"
    out = await caller.fails("null.f", language="javascript")
    assert out.metadata["error"]["name"] == "TypeError"
    assert _text(out) == "TypeError: Cannot read properties of null (reading 'f')\n    at <cell 5>:1:6"
    out = await caller.fails("x", language="python")  # another language, another context
    assert out.metadata["error"]["name"] == "NameError"


async def test_input_reads_end_of_file_rather_than_the_next_request(caller: Caller) -> None:
    out = await caller.fails("input('name? ')")
    assert out.metadata["error"]["name"] == "EOFError"
    assert _text(await caller.run("1 + 1")) == "2"


async def test_a_cancel_interrupts_the_cell_and_keeps_the_context(caller: Caller) -> None:
    await caller.run("x = 41")
    running = RunCodeTool()
    call = asyncio.ensure_future(caller.run("import time\nwhile True: time.sleep(0.01)", running))
    await until(lambda: running._running, what="the cell's start")
    assert await running.cancel()
    with pytest.raises(ToolCancelled) as info:
        await call
    assert info.value.output is not None and "KeyboardInterrupt" in _text(info.value.output)
    assert _text(await caller.run("x")) == "41"


def test_a_cells_images_are_bounded() -> None:
    png = base64.b64encode(_png(2, 2)).decode()
    cell = Cell(done={"count": 1, "result": None, "error": None, "figures": [png] * (MAX_IMAGES + 2)})
    output, failure = render(cell, [], {})
    images = [b for b in output.content if isinstance(b, ImageBlock)]
    assert failure is None and len(images) == MAX_IMAGES and output.metadata["images"] == MAX_IMAGES
    assert "2 more images not shown" in _text(output)


def test_the_longest_cell_fits_the_tables_stdin_bound() -> None:
    schema = RunCodeTool.definition.input_schema["properties"]["code"]
    worst = json.dumps({"id": "0" * 16, "code": "\x01" * schema["maxLength"]}) + "\n"  # 6 bytes each
    assert len(worst.encode()) < Limits().stdin_bytes
