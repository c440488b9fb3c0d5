"""Custom tool factories that must not register: each makes ``dispatcher serve`` exit 2."""

from __future__ import annotations

from typing import Any

from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput


class _Tool:
    def __init__(self, definition: ToolDefinition) -> None:
        self.definition = definition

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([TextBlock("never")])

    async def cancel(self) -> bool:
        return False


def _definition(name: str, schema: dict[str, Any] | None = None) -> ToolDefinition:
    return ToolDefinition(
        name=name,
        description="a tool that must not register",
        input_schema=schema or {"type": "object", "properties": {}},
        side_effect=SideEffect.NONE,
    )


def builtin_name() -> _Tool:
    """Takes the built-in read_file's name."""
    return _Tool(_definition("read_file"))


def any_of_schema() -> _Tool:
    """Uses anyOf, outside the provider-safe subset."""
    return _Tool(
        _definition("union", {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}})
    )


def fine() -> _Tool:
    return _Tool(_definition("fine"))
