"""Small in-process tools for unit tests of the core (an echo NONE tool, slow, stubborn, raising...)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from dispatcher.core import (
    SideEffect,
    TextBlock,
    ToolContext,
    ToolDefinition,
    ToolOutput,
)
from dispatcher.core.errors import ToolCancelled
from dispatcher.core.events.bus import Event, EventPayload, Subscription
from tests.events import EventOf, is_event

P = TypeVar("P", bound=EventPayload)

OBJ: dict[str, Any] = {"type": "object", "additionalProperties": False}


def definition(name: str, effect: SideEffect = SideEffect.NONE, **kw: Any) -> ToolDefinition:
    schema = kw.pop("input_schema", {**OBJ, "properties": {"text": {"type": "string"}}})
    return ToolDefinition(
        name=name, description=f"{name} tool", input_schema=schema, side_effect=effect, **kw
    )


class EchoTool:
    """NONE: returns its text."""

    definition = definition("echo")

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([TextBlock(input.get("text", ""))], metadata={"echo": True})

    async def cancel(self) -> bool:
        return False


class SlowTool:
    """Polls its cancel event; emits a little output first so partial output can be checked."""

    definition = definition(
        "slow", input_schema={**OBJ, "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}
    )
    started: asyncio.Event | None = None

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        context.emit_output("stdout", "working\n")
        if SlowTool.started is not None:
            SlowTool.started.set()
        try:
            await asyncio.wait_for(context.cancel_event.wait(), input["seconds"])
        except TimeoutError:
            return ToolOutput([TextBlock("finished")])
        raise ToolCancelled("stopped", output=ToolOutput([TextBlock("partial: working")], success=False))

    async def cancel(self) -> bool:
        return True


class StubbornTool:
    """Ignores its cancel event entirely (spec 000: the dispatcher must abandon it)."""

    definition = definition("stubborn")
    release: asyncio.Event | None = None

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        assert StubbornTool.release is not None
        await StubbornTool.release.wait()
        return ToolOutput([TextBlock("too late")])

    async def cancel(self) -> bool:
        return False


class RaisingTool:
    """Raises something that is not a ToolError."""

    definition = definition("raiser")

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        raise RuntimeError("secret internal detail /srv/private/db.sqlite")

    async def cancel(self) -> bool:
        return False


class WriteTool:
    """WRITE: writes a file through the workspace API."""

    definition = definition(
        "write",
        SideEffect.WRITE,
        input_schema={
            **OBJ,
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
        requires_fs=(("path", "rw"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        await context.workspace_files.write(input["path"], input["content"])
        return ToolOutput([TextBlock("ok")], files_modified=[input["path"]])

    async def cancel(self) -> bool:
        return False


class ReadTool:
    """READ: reads a file through the workspace API."""

    definition = definition(
        "read",
        SideEffect.READ,
        input_schema={**OBJ, "properties": {"path": {"type": "string"}}, "required": ["path"]},
        requires_fs=(("path", "r"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([TextBlock(await context.workspace_files.read(input["path"]))])

    async def cancel(self) -> bool:
        return False


class ShellLikeTool:
    """EXECUTE: runs a command through the sandbox."""

    definition = definition(
        "run", SideEffect.EXECUTE, input_schema={**OBJ, "properties": {"command": {"type": "string"}}}
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([TextBlock("ran")], command_executed=input.get("command"))

    async def cancel(self) -> bool:
        return False


ALL_TOOLS: list[Callable[[], Any]] = [
    EchoTool,
    SlowTool,
    StubbornTool,
    RaisingTool,
    WriteTool,
    ReadTool,
    ShellLikeTool,
]


def types_of(events: list[Event]) -> list[str]:
    return [e.type for e in events]


async def next_event(sub: Subscription, kind: type[P], timeout: float = 5.0) -> EventOf[P]:
    """The next event with a ``kind`` payload from a subscription (waits on the stream, not on time)."""
    async with asyncio.timeout(timeout):
        async for event in sub:
            if is_event(event, kind):
                return event
    raise AssertionError(f"stream ended before a {kind.__name__} event")
