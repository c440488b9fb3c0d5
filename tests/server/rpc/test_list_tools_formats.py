"""ListTools in each provider's shape over real gRPC, and glob/grep running unasked in cautious mode."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from dispatcher.client import RequestFailed
from dispatcher.core.events.bus import Event
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from tests.blocks import text_at
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness


async def test_each_format_gives_the_tools_in_that_shape(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    names = [t.name for t in await client.list_tools(session.session_id)]
    openai = await client.tools_for(session, "openai")
    anthropic = await client.tools_for(session.session_id, "anthropic")
    mcp = await client.tools_for(session, "mcp")
    assert [t["function"]["name"] for t in openai] == names
    assert [t["name"] for t in anthropic] == [t["name"] for t in mcp] == names
    assert {"glob", "grep"} <= set(names)
    by_name = {t["name"]: t for t in anthropic}
    assert by_name["grep"]["input_schema"]["required"] == ["pattern"]
    assert openai[names.index("shell")]["type"] == "function"
    assert {t["name"]: t["annotations"]["readOnlyHint"] for t in mcp}["read_file"] is True
    with pytest.raises(ValueError, match="expected 'openai', 'anthropic' or 'mcp'"):
        await client.tools_for(session, "gemini")


async def test_without_a_format_only_the_tools_and_an_unknown_one_is_refused(harness: Harness) -> None:
    session = await harness.client().create_session()
    async with grpc.aio.insecure_channel(harness.target) as channel:
        stub = pb_grpc.ToolDispatcherStub(channel)
        auth = (("authorization", f"Bearer {TOKEN_ALPHA}"),)
        plain = await stub.ListTools(pb.ListToolsRequest(session_id=session.session_id), metadata=auth)
        assert plain.tools and plain.definitions_json == ""
        shaped = await stub.ListTools(
            pb.ListToolsRequest(session_id=session.session_id, format=pb.TOOL_FORMAT_ANTHROPIC), metadata=auth
        )
        assert [t["name"] for t in json.loads(shaped.definitions_json)] == [t.name for t in shaped.tools]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListTools(
                pb.ListToolsRequest(session_id=session.session_id, format=42),  # type: ignore[arg-type]
                metadata=auth,
            )
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "format: unknown value 42" in (err.value.details() or "")


async def test_glob_and_grep_run_unasked_in_cautious_mode(harness: Harness) -> None:
    client = harness.client(TOKEN_BETA)  # beta has the default policy
    session = await client.create_session("search", mode="cautious")
    (Path(session.workspace_path) / "notes.md").write_text("alpha\nneedle here\n")
    events: list[Event] = []
    grep = await client.call(session.session_id, "grep", {"pattern": "needle"}, on_event=events.append)
    glob = await client.call(session.session_id, "glob", {"pattern": "*.md"}, on_event=events.append)
    assert not grep.is_error and text_at(grep) == "notes.md:2:needle here"
    assert not glob.is_error and text_at(glob) == "notes.md"
    assert not [e for e in events if e.type.startswith("tool.confirmation")]
    escaped = await client.call(session.session_id, "grep", {"pattern": "root", "path": "../.."})
    assert escaped.is_error and str(escaped.error_class) == "permission_denied"


async def test_an_unknown_session_is_not_found(harness: Harness) -> None:
    with pytest.raises(RequestFailed) as err:
        await harness.client().tools_for("ses_nope", "openai")
    assert err.value.code == "NOT_FOUND"


async def test_the_official_sdks_accept_what_list_tools_gives(harness: Harness) -> None:
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (.[dev])")
    openai = pytest.importorskip("openai", reason="the openai SDK is not installed (.[dev])")
    from mcp.types import Tool as McpTool
    from pydantic import TypeAdapter

    client = harness.client()
    session = await client.create_session()
    anthropic_tools = TypeAdapter(anthropic.types.ToolParam)
    for tool in await client.tools_for(session, "anthropic"):
        assert anthropic_tools.validate_python(tool) == tool
    openai_tools = TypeAdapter(openai.types.chat.ChatCompletionToolParam)
    for tool in await client.tools_for(session, "openai"):
        assert openai_tools.validate_python(tool) == tool
    for tool in await client.tools_for(session, "mcp"):
        assert McpTool.model_validate(tool).model_dump(by_alias=True, exclude_none=True) == tool


async def test_results_go_back_as_messages_the_sdks_accept(harness: Harness) -> None:
    """One turn of an agent loop: tools out in a provider's shape, results back in its messages."""
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed (.[dev])")
    openai = pytest.importorskip("openai", reason="the openai SDK is not installed (.[dev])")
    from pydantic import TypeAdapter

    from dispatcher.client import anthropic_tool_results, openai_tool_messages

    client = harness.client()
    session = await client.create_session()
    png = b"\x89PNG\r\n\x1a\n" + bytes(24)
    (Path(session.workspace_path) / "pic.png").write_bytes(png)
    (Path(session.workspace_path) / "a.txt").write_text("needle\n")
    results = [
        await client.call(session.session_id, "grep", {"pattern": "needle"}),
        await client.call(session.session_id, "read_file", {"path": "pic.png"}),
        await client.call(session.session_id, "read_file", {"path": "missing.txt"}),
    ]
    message = anthropic_tool_results(results)
    anthropic_message = TypeAdapter(anthropic.types.MessageParam)
    checked = anthropic_message.validate_python(message)
    assert [block["tool_use_id"] for block in checked["content"]] == [r.tool_use_id for r in results]
    assert message["content"][2]["is_error"] is True
    openai_message = TypeAdapter(openai.types.chat.ChatCompletionMessageParam)
    messages = openai_tool_messages(results)
    for item in messages:
        openai_message.validate_python(item)
    assert [m["role"] for m in messages] == ["tool", "tool", "tool", "user"]
    assert messages[0]["content"] == "a.txt:1:needle"
