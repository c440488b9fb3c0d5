"""Tool definitions in each provider's shape, checked with the official SDKs' own types (no network).

The SDKs are dev dependencies (pyproject's ``dev`` extra); without them these tests skip and say
which is missing. A TypedDict validated by pydantic drops keys it does not know, so each check
also asserts that validation gave back exactly what was sent: every key known, every value kept.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from dispatcher.client import anthropic_tool_results, openai_tool_messages
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.tool_shapes import ToolFormat, to_provider
from dispatcher.core.types import ImageBlock, TextBlock, ToolDefinition, ToolResultBlock
from dispatcher.tools import BUILTIN_TOOLS
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert

DEFINITIONS: list[ToolDefinition] = [factory().definition for factory in BUILTIN_TOOLS]
PNG = b"\x89PNG\r\n\x1a\n" + bytes(24)


def _sdk(name: str) -> Any:
    return pytest.importorskip(name, reason=f"the {name} SDK is not installed (pip install -e '.[dev]')")


def _validated(type_: Any, value: Any) -> Any:
    from pydantic import TypeAdapter

    adapter = TypeAdapter(type_)  # alive while its lazy iterators are read
    validated = _plain(adapter.validate_python(value))
    return validated


def _plain(value: Any) -> Any:
    """Validated values with their lazy iterables (an SDK's ``Iterable[...]`` fields) made lists."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, str | bytes | int | float | bool) or value is None:
        return value
    return [_plain(item) for item in value]


def test_openai_shape_is_the_sdks_tool_param() -> None:
    ChatCompletionToolParam = _sdk("openai").types.chat.ChatCompletionToolParam

    shaped = json.loads(convert.definitions_json(DEFINITIONS, ToolFormat.OPENAI))
    assert [tool["function"]["name"] for tool in shaped] == [d.name for d in DEFINITIONS]
    for tool in shaped:
        assert _validated(ChatCompletionToolParam, tool) == tool


def test_anthropic_shape_is_the_sdks_tool_param() -> None:
    ToolParam = _sdk("anthropic").types.ToolParam

    shaped = json.loads(convert.definitions_json(DEFINITIONS, ToolFormat.ANTHROPIC))
    for tool in shaped:
        assert _validated(ToolParam, tool) == tool
        assert tool["input_schema"]["type"] == "object"


def test_mcp_shape_is_the_sdks_tool_model() -> None:
    mcp_types = _sdk("mcp.types")
    shaped = json.loads(convert.definitions_json(DEFINITIONS, ToolFormat.MCP))
    for tool in shaped:
        model = mcp_types.Tool.model_validate(tool)
        assert model.model_dump(by_alias=True, exclude_none=True) == tool
    by_name = {tool["name"]: tool["annotations"] for tool in shaped}
    assert by_name["grep"]["readOnlyHint"] is True and by_name["shell"]["readOnlyHint"] is False


def test_formats_map_both_ways_and_unknown_values_are_refused() -> None:
    for format in ToolFormat:
        assert convert.tool_format_from_pb(convert.tool_format_to_pb(format)) is format
    assert convert.tool_format_from_pb(pb.TOOL_FORMAT_UNSPECIFIED) is None
    assert convert.tool_format_to_pb(None) == pb.TOOL_FORMAT_UNSPECIFIED
    with pytest.raises(ValueError, match="format: unknown value 99"):
        convert.tool_format_from_pb(99)
    with pytest.raises(ValueError):
        to_provider(DEFINITIONS[0], "gemini")


RESULTS = [
    ToolResultBlock("toolu_1", (TextBlock("a.py:1:x = 1"),)),
    ToolResultBlock("toolu_2", (ImageBlock(PNG, "image/png"),)),
    ToolResultBlock(
        "toolu_3", (TextBlock("no such file"),), is_error=True, error_class=ToolErrorClass.EXECUTION_ERROR
    ),
    ToolResultBlock("toolu_4", (TextBlock(""),)),
]


def test_anthropic_tool_results_is_one_user_message_the_sdk_accepts() -> None:
    MessageParam = _sdk("anthropic").types.MessageParam

    message = anthropic_tool_results(RESULTS)
    assert _validated(MessageParam, message) == message
    first, image, error, empty = message["content"]
    assert first == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "a.py:1:x = 1"}],
    }
    assert base64.b64decode(image["content"][0]["source"]["data"]) == PNG
    assert error["is_error"] is True and empty["content"] == []


def test_openai_tool_messages_are_messages_the_sdk_accepts() -> None:
    ChatCompletionMessageParam = _sdk("openai").types.chat.ChatCompletionMessageParam

    messages = openai_tool_messages(RESULTS)
    for message in messages:
        assert _validated(ChatCompletionMessageParam, message) == message
    assert [m["role"] for m in messages] == ["tool", "tool", "tool", "tool", "user"]
    assert messages[0] == {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py:1:x = 1"}
    assert messages[2]["content"] == "Error (execution_error): no such file"
    url = messages[4]["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == PNG
    assert openai_tool_messages(RESULTS[:1]) == messages[:1]  # no image, no user message
