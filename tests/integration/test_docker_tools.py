"""The five built-in tools against a real Docker sandbox, through their classes and a ToolContext."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from dispatcher.core.errors import (
    ToolCancelled,
    ToolError,
    ToolExecutionError,
    ToolTimeout,
    WorkspaceEscapeError,
)
from dispatcher.core.sandbox_api import FileOpError, Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import ImageBlock, TextBlock, Tool, ToolOutput
from dispatcher.tools import ListDirTool, PatchFileTool, ReadFileTool, ShellTool, WriteFileTool
from tests.integration.helpers import tool_context

pytestmark = pytest.mark.docker

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(32)


async def call(tool: Tool, sandbox: Sandbox, session: Session, **input: Any) -> ToolOutput:
    context, _ = tool_context(sandbox, session.workspace_path)
    return await tool.execute(input, context)


def text(output: ToolOutput) -> str:
    return "".join(block.text for block in output.content if isinstance(block, TextBlock))


async def test_write_then_read_with_offset_and_limit(sandbox: Sandbox, session: Session) -> None:
    body = "".join(f"line {i}\n" for i in range(1, 11))
    written = await call(WriteFileTool(), sandbox, session, path="src/notes.txt", content=body)
    assert written.files_modified == ["src/notes.txt"]
    with open(os.path.join(session.workspace_path, "src/notes.txt")) as f:
        assert f.read() == body
    out = await call(ReadFileTool(), sandbox, session, path="src/notes.txt", offset=3, limit=2)
    assert "line 3" in text(out) and "line 4" in text(out)
    assert "line 2" not in text(out) and "line 5" not in text(out)


async def test_write_is_atomic_and_keeps_the_mode(sandbox: Sandbox, session: Session) -> None:
    path = os.path.join(session.workspace_path, "run.sh")
    await call(WriteFileTool(), sandbox, session, path="run.sh", content="#!/bin/sh\necho one\n")
    os.chmod(path, 0o755)
    await call(WriteFileTool(), sandbox, session, path="/workspace/run.sh", content="#!/bin/sh\necho two\n")
    assert os.stat(path).st_mode & 0o777 == 0o755
    assert not [n for n in os.listdir(session.workspace_path) if n.endswith(".tmp")]


async def test_read_image_and_refuse_binary(sandbox: Sandbox, session: Session) -> None:
    await sandbox.write_bytes("pic.png", PNG)
    await sandbox.write_bytes("blob.bin", b"\x7fELF\x00\x01\x02")
    out = await call(ReadFileTool(), sandbox, session, path="pic.png")
    assert isinstance(out.content[0], ImageBlock) and out.content[0].media_type == "image/png"
    with pytest.raises(FileOpError) as excinfo:
        await call(ReadFileTool(), sandbox, session, path="blob.bin")
    assert excinfo.value.code == "binary"


async def test_patch_exactly_once_or_change_nothing(sandbox: Sandbox, session: Session) -> None:
    await sandbox.write("p.py", "a = 1\nb = 1\n")
    out = await call(PatchFileTool(), sandbox, session, path="p.py", old="a = 1", new="a = 2")
    assert out.files_modified == ["p.py"]
    assert await sandbox.read("p.py") == "a = 2\nb = 1\n"
    for old, code in (("zzz", "no_match"), (" = ", "multiple_matches")):
        with pytest.raises(FileOpError) as excinfo:
            await call(PatchFileTool(), sandbox, session, path="p.py", old=old, new="x")
        assert excinfo.value.code == code
    assert await sandbox.read("p.py") == "a = 2\nb = 1\n"


async def test_list_dir_marks_kinds_and_truncates(sandbox: Sandbox, session: Session) -> None:
    await sandbox.write("d/sub/f.txt", "x")
    os.symlink("sub/f.txt", os.path.join(session.workspace_path, "d/link"))
    out = await call(ListDirTool(), sandbox, session, path="d")
    listing = text(out)
    assert "sub/" in listing and "link" in listing
    many = await call(
        ShellTool(), sandbox, session, command="mkdir -p many && cd many && touch $(seq 1 1200)"
    )
    assert many.metadata["exit_code"] == 0
    out = await call(ListDirTool(), sandbox, session, path="many")
    assert out.metadata["truncated"] is True


async def test_shell_exit_codes_metadata_and_deltas(sandbox: Sandbox, session: Session) -> None:
    context, deltas = tool_context(sandbox, session.workspace_path)
    out = await ShellTool().execute({"command": "echo out; echo err >&2; pwd"}, context)
    assert out.metadata["exit_code"] == 0
    assert out.command_executed == "echo out; echo err >&2; pwd"
    assert "out" in text(out) and "err" in text(out) and "/workspace" in text(out)
    assert deltas, "output was not streamed as deltas"
    with pytest.raises(ToolExecutionError) as excinfo:
        await call(ShellTool(), sandbox, session, command="echo failing; exit 3")
    assert excinfo.value.output is not None
    assert excinfo.value.output.metadata["exit_code"] == 3
    assert "failing" in text(excinfo.value.output)
    json.dumps(excinfo.value.output.metadata)  # metadata_json must serialise


async def test_shell_timeout_keeps_partial_output(sandbox: Sandbox, session: Session) -> None:
    with pytest.raises(ToolTimeout) as excinfo:
        await call(ShellTool(), sandbox, session, command="echo before; sleep 30", timeout_seconds=1)
    assert excinfo.value.output is not None
    assert "before" in text(excinfo.value.output)


async def test_shell_cancel_keeps_partial_output(sandbox: Sandbox, session: Session) -> None:
    cancel = asyncio.Event()
    context, deltas = tool_context(sandbox, session.workspace_path, cancel=cancel)
    task = asyncio.ensure_future(ShellTool().execute({"command": "echo started; sleep 30"}, context))
    while not any("started" in chunk for _, chunk in deltas):
        await asyncio.wait([task], timeout=0.02)
        assert not task.done(), task
    cancel.set()
    with pytest.raises(ToolCancelled) as excinfo:
        await asyncio.wait_for(task, 10)
    assert excinfo.value.output is not None
    assert "started" in text(excinfo.value.output)


@pytest.mark.parametrize(
    "tool, input",
    [
        (ReadFileTool, {"path": "../outside.txt"}),
        (ReadFileTool, {"path": "/etc/passwd"}),
        (WriteFileTool, {"path": "/tmp/x", "content": "x"}),
        (ListDirTool, {"path": "/"}),
    ],
)
async def test_tools_refuse_paths_outside_the_workspace(
    sandbox: Sandbox, session: Session, tool: type[Tool], input: dict[str, Any]
) -> None:
    with pytest.raises(ToolError) as excinfo:
        await call(tool(), sandbox, session, **input)
    assert isinstance(excinfo.value, WorkspaceEscapeError)
