"""A custom tool that writes log lines, for the structured-log tests of a real ``dispatcher serve``."""

from __future__ import annotations

import logging
from typing import Any

from dispatcher.core import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput

_plain = logging.getLogger("dispatcher.tests.log_tool")


class LogTool:
    """NONE: logs one line through its context logger and one through a plain module logger."""

    definition = ToolDefinition(
        name="say",
        description="Write log lines.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        side_effect=SideEffect.NONE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        context.logger.warning("context logger: %s", input.get("text", ""))
        _plain.warning("plain logger: %s", input.get("text", ""))
        return ToolOutput([TextBlock("said")])

    async def cancel(self) -> bool:
        return False


def make_log_tool() -> LogTool:
    return LogTool()
