"""In-process tools for the server tests: no sandbox needed, deterministic, cancellable."""

from __future__ import annotations

import json
from typing import Any

from dispatcher.core.errors import ToolCancelled
from dispatcher.core.process_api import ShellState
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput


class EchoTool:
    """NONE: returns its ``text``; the cheapest possible call through the whole stack."""

    definition = ToolDefinition(
        name="echo",
        description="Return the given text.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["text"],
        },
        side_effect=SideEffect.NONE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([TextBlock(input["text"])], metadata={"n": input.get("n")})

    async def cancel(self) -> bool:
        return False


class BlockTool:
    """NONE: prints a line, then waits until cancelled (for disconnect and cancel tests)."""

    definition = ToolDefinition(
        name="block",
        description="Wait until cancelled.",
        input_schema={"type": "object", "properties": {}},
        side_effect=SideEffect.NONE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        context.emit_output("stdout", "blocking\n")
        await context.cancel_event.wait()
        raise ToolCancelled(
            "block was cancelled", output=ToolOutput([TextBlock("blocking\n")], success=False)
        )

    async def cancel(self) -> bool:
        return True


def make_echo_tool() -> EchoTool:
    return EchoTool()


def make_block_tool() -> BlockTool:
    return BlockTool()


class RememberTool:
    """NONE: what the session's process memory holds, after remembering what the input says (a
    shell that ended in ``cwd`` with ``env``; ``read``: cursors the model read to); ``ask``: the
    processes whose last-read cursors to answer."""

    definition = ToolDefinition(
        name="remember",
        description="Remember a shell state and read cursors; answer what is remembered.",
        input_schema={
            "type": "object",
            "properties": {
                "cwd": {"type": "string"},
                "env": {"type": "object"},
                "read": {"type": "object"},
                "ask": {"type": "array", "items": {"type": "string"}},
            },
        },
        side_effect=SideEffect.NONE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        memory = context.processes
        assert memory is not None
        if "cwd" in input or "env" in input:
            memory.shell_ended(ShellState(cwd=input.get("cwd"), env=input.get("env", {})))
        for process_id, cursor in input.get("read", {}).items():
            memory.read_to(process_id, cursor)
        cwd, env = memory.shell_start()
        cursors = {pid: memory.last_read(pid) for pid in input.get("ask", [])}
        return ToolOutput([TextBlock(json.dumps({"cwd": cwd, "env": dict(env), "cursors": cursors}))])

    async def cancel(self) -> bool:
        return False


def make_remember_tool() -> RememberTool:
    return RememberTool()
