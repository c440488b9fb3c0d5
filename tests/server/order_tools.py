"""In-process tools for the ordering tests: a read that proves concurrency by meeting others."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput

MEET_SECONDS = 10.0
"""How long a ``meet`` call waits for the rest of its group before it gives up (a failure)."""

_arrived: defaultdict[str, int] = defaultdict(int)
_everyone_here: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)


class MeetTool:
    """READ: returns ``met`` once ``n`` calls with the same ``group`` are running at the same time,
    ``alone`` if they never all were (so calls that ran one after another fail the test, and no
    test sleeps to find out)."""

    definition = ToolDefinition(
        name="meet",
        description="Wait until n calls of the same group are running.",
        input_schema={
            "type": "object",
            "properties": {"group": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["group", "n"],
        },
        side_effect=SideEffect.READ,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        group = input["group"]
        _arrived[group] += 1
        if _arrived[group] >= input["n"]:
            _everyone_here[group].set()
        try:
            await asyncio.wait_for(_everyone_here[group].wait(), MEET_SECONDS)
        except TimeoutError:
            return ToolOutput([TextBlock("alone")])
        return ToolOutput([TextBlock("met")])

    async def cancel(self) -> bool:
        return False


def make_meet_tool() -> MeetTool:
    return MeetTool()
