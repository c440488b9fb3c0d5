"""Our tools and results in MCP's shapes: one function each way, nothing else."""

from __future__ import annotations

import base64

import mcp_types as mt

from dispatcher.core.blocks import ImageBlock, SideEffect, TextBlock
from dispatcher.core.types import ToolResultBlock
from dispatcher.wire.convert import ToolInfo


def hints(side_effect: SideEffect) -> mt.ToolAnnotations:
    """MCP's hints from the side-effect class: what a host may run unasked, and what reaches out."""
    read_only = side_effect in (SideEffect.NONE, SideEffect.READ)
    return mt.ToolAnnotations(
        read_only_hint=read_only,
        # The spec reads destructiveHint only when readOnlyHint is false; NETWORK changes nothing
        # here (its bytes leave through the egress policy), so it is not called destructive.
        destructive_hint=side_effect in (SideEffect.WRITE, SideEffect.EXECUTE),
        open_world_hint=side_effect is SideEffect.NETWORK,
    )


def tool(info: ToolInfo) -> mt.Tool:
    """A session's tool as ``tools/list`` shows it: its JSON Schema as is, and the hints."""
    description = info.description
    if info.always_prompt:
        description += "\n\nEvery call of this tool asks a human first."
    return mt.Tool(
        name=info.name,
        description=description,
        input_schema=dict(info.input_schema),
        annotations=hints(info.side_effect),
    )


def result(block: ToolResultBlock) -> mt.CallToolResult:
    """A tool result as ``tools/call`` answers it: text and images kept, ``isError`` kept.

    A failure's class and reason go in ``_meta`` (the text already says what happened, for the model).
    """
    content: list[mt.TextContent | mt.ImageContent] = []
    for part in block.content:
        if isinstance(part, TextBlock):
            content.append(mt.TextContent(type="text", text=part.text))
        elif isinstance(part, ImageBlock):
            data = base64.b64encode(part.data).decode("ascii")
            content.append(mt.ImageContent(type="image", data=data, mime_type=part.media_type))
    meta: dict[str, object] = {}
    if block.is_error:
        meta["dispatcher/error_class"] = str(block.error_class) if block.error_class else ""
        if block.reason:
            meta["dispatcher/reason"] = block.reason
    if "exit_code" in block.metadata:
        meta["dispatcher/exit_code"] = block.metadata["exit_code"]
    return mt.CallToolResult(content=list(content), is_error=block.is_error, _meta=meta or None)
