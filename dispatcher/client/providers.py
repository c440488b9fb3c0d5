"""Results back into a model provider's messages: what an agent loop appends after a Dispatch.

``tools_for`` (on both clients) gives the definitions in a provider's shape; these functions turn
the ``ToolResultBlock``s a Dispatch returned into that provider's tool-result message(s), so an
agent loop needs no shape of its own on either side. Plain dicts, the shapes of the official SDKs'
parameter types (``anthropic.types.MessageParam``, ``openai.types.chat.ChatCompletionMessageParam``),
which the tests check with those types.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from dispatcher.core.types import ImageBlock, TextBlock, ToolResultBlock

__all__ = ["anthropic_tool_results", "openai_tool_messages"]


def anthropic_tool_results(results: Iterable[ToolResultBlock]) -> dict[str, Any]:
    """One Anthropic ``user`` message with a ``tool_result`` block per result, in order (the
    Messages API wants every result of an assistant turn in the next user message)."""
    return {"role": "user", "content": [_anthropic_result(result) for result in results]}


def _anthropic_result(result: ToolResultBlock) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for block in result.content:
        if isinstance(block, ImageBlock):
            data = base64.b64encode(block.data).decode("ascii")
            source = {"type": "base64", "media_type": block.media_type, "data": data}
            content.append({"type": "image", "source": source})
        elif block.text:  # the API refuses an empty text block
            content.append({"type": "text", "text": block.text})
    message: dict[str, Any] = {"type": "tool_result", "tool_use_id": result.tool_use_id, "content": content}
    if result.is_error:
        message["is_error"] = True
    return message


def openai_tool_messages(results: Iterable[ToolResultBlock]) -> list[dict[str, Any]]:
    """A ``tool`` message per result, in order, for OpenAI's Chat Completions.

    A tool message holds text only: an image result says so in its text, and the images follow
    in one ``user`` message after the tool messages (as data URLs), which is where the API takes
    them. A failed call's text starts with ``Error (<error_class>):``, since the message has no
    error flag.
    """
    messages: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []
    for result in results:
        parts: list[str] = []
        for block in result.content:
            if isinstance(block, TextBlock):
                parts.append(block.text)
                continue
            parts.append(f"[{block.media_type} image: in the user message after the tool results]")
            url = f"data:{block.media_type};base64,{base64.b64encode(block.data).decode('ascii')}"
            images.append({"type": "text", "text": f"Image returned by tool call {result.tool_use_id}:"})
            images.append({"type": "image_url", "image_url": {"url": url}})
        text = "\n".join(parts)
        if result.is_error:
            what = result.error_class.value if result.error_class is not None else "error"
            text = f"Error ({what}): {text}"
        messages.append({"role": "tool", "tool_call_id": result.tool_use_id, "content": text})
    if images:
        messages.append({"role": "user", "content": images})
    return messages
