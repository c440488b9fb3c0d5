"""In-process tools for the server tests: no sandbox needed, deterministic, cancellable."""

from __future__ import annotations

from typing import Any

from dispatcher.core.errors import ToolCancelled
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
