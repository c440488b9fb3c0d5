"""An in-process tool for the limit tests: a result of several big text blocks."""

from __future__ import annotations

from typing import Any

from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput


class BlocksTool:
    """NONE: returns ``count`` text blocks of ``chars`` characters each."""

    definition = ToolDefinition(
        name="blocks",
        description="Return count text blocks of chars characters.",
        input_schema={
            "type": "object",
            "properties": {"count": {"type": "integer"}, "chars": {"type": "integer"}},
            "required": ["count", "chars"],
        },
        side_effect=SideEffect.NONE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([TextBlock(str(i) * input["chars"]) for i in range(input["count"])])

    async def cancel(self) -> bool:
        return False


def make_blocks_tool() -> BlocksTool:
    return BlocksTool()
