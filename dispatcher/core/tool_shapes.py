"""What a tool definition looks like to each model provider's API: the one place those shapes are.

The server's ``ListTools`` gives them (``definitions_json``) and the registry re-exports the three
functions; stdlib only, so a client that converts formats loads nothing of the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from dispatcher.core.types import SideEffect, ToolDefinition

__all__ = ["ToolFormat", "to_anthropic", "to_mcp", "to_openai", "to_provider"]


def to_anthropic(definition: ToolDefinition) -> dict[str, Any]:
    """Anthropic Messages API tool shape."""
    return {
        "name": definition.name,
        "description": definition.description,
        "input_schema": dict(definition.input_schema),
    }


def to_openai(definition: ToolDefinition) -> dict[str, Any]:
    """OpenAI function-calling tool shape."""
    return {
        "type": "function",
        "function": {
            "name": definition.name,
            "description": definition.description,
            "parameters": dict(definition.input_schema),
        },
    }


def to_mcp(definition: ToolDefinition) -> dict[str, Any]:
    """MCP ``tools/list`` entry, with annotations derived from the side-effect class."""
    effect = definition.side_effect
    annotations: Mapping[str, bool] = {
        "readOnlyHint": effect in (SideEffect.NONE, SideEffect.READ),
        "destructiveHint": effect in (SideEffect.WRITE, SideEffect.EXECUTE, SideEffect.NETWORK),
        "idempotentHint": effect in (SideEffect.NONE, SideEffect.READ),
        "openWorldHint": effect in (SideEffect.EXECUTE, SideEffect.NETWORK),
    }
    return {
        "name": definition.name,
        "description": definition.description,
        "inputSchema": dict(definition.input_schema),
        "annotations": dict(annotations),
    }


class ToolFormat(StrEnum):
    """A model provider's shape of a tool definition (``ListToolsRequest.format``)."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    MCP = "mcp"


_SHAPES = {ToolFormat.OPENAI: to_openai, ToolFormat.ANTHROPIC: to_anthropic, ToolFormat.MCP: to_mcp}


def to_provider(definition: ToolDefinition, format: ToolFormat | str) -> dict[str, Any]:
    """``definition`` in the shape ``format`` names.

    Raises:
        ValueError: a format that is not one of ``ToolFormat``'s.
    """
    return _SHAPES[ToolFormat(format)](definition)
