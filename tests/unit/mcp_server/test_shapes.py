"""Our tools, results and confirmations in MCP's shapes (dispatcher/mcp_server/)."""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator

import mcp_types as mt
import pytest

from dispatcher.client.base import DispatchItem
from dispatcher.core.approval.broker import Decision
from dispatcher.core.blocks import ImageBlock, SideEffect, TextBlock
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.events.payloads import ToolConfirmationRequested
from dispatcher.core.types import ToolResultBlock
from dispatcher.mcp_server import approval, shapes
from dispatcher.mcp_server.pending import Pending, PendingCalls
from dispatcher.wire.convert import ToolInfo
from tests.polling import until


@pytest.mark.parametrize(
    ("side_effect", "read_only", "destructive", "open_world"),
    [
        (SideEffect.NONE, True, False, False),
        (SideEffect.READ, True, False, False),
        (SideEffect.WRITE, False, True, False),
        (SideEffect.EXECUTE, False, True, False),
        (SideEffect.NETWORK, False, False, True),
    ],
)
def test_hints_follow_the_side_effect_class(
    side_effect: SideEffect, read_only: bool, destructive: bool, open_world: bool
) -> None:
    info = ToolInfo("t", "does t", {"type": "object", "properties": {}}, side_effect)
    tool = shapes.tool(info)
    assert tool.annotations == mt.ToolAnnotations(
        read_only_hint=read_only, destructive_hint=destructive, open_world_hint=open_world
    )
    assert tool.input_schema == {"type": "object", "properties": {}}


def test_an_always_asking_tool_says_so() -> None:
    info = ToolInfo("rm", "removes", {"type": "object"}, SideEffect.WRITE, always_prompt=True)
    assert "asks a human" in (shapes.tool(info).description or "")


def test_results_keep_text_images_and_errors() -> None:
    png = b"\x89PNG\r\n\x1a\nrest"
    block = ToolResultBlock(
        "tu_1",
        (TextBlock("hello"), ImageBlock(png, "image/png")),
        is_error=True,
        error_class=ToolErrorClass.EXECUTION_ERROR,
        metadata={"exit_code": 2},
    )
    out = shapes.result(block)
    assert out.is_error
    assert out.content[0] == mt.TextContent(type="text", text="hello")
    image = out.content[1]
    assert isinstance(image, mt.ImageContent)
    assert base64.b64decode(image.data) == png and image.mime_type == "image/png"
    assert out.meta == {
        "dispatcher/error_class": str(ToolErrorClass.EXECUTION_ERROR),
        "dispatcher/exit_code": 2,
    }


def test_the_question_is_what_watch_shows_with_where_else_to_answer() -> None:
    p = ToolConfirmationRequested(
        request_id="cr_1",
        tool_name="write_file",
        input_summary="path: a.txt\ncontent: hi",
        side_effect="write",
        projected_modifications=("/workspace/a.txt",),
        diff="--- a/a.txt\n+++ b/a.txt\n+hi\n",
    )
    q = approval.question("s_1", p)
    assert "confirmation cr_1 requested for write_file (write) -> modifies /workspace/a.txt" in q.message
    assert "| path: a.txt" in q.message and "| +hi" in q.message
    assert "dispatcher approve s_1 cr_1" in q.message
    assert q.requested_schema["required"] == ["decision"]
    assert "dispatcher approve s_1 cr_1" in approval.waiting_note("s_1", p)


@pytest.mark.parametrize(
    ("result", "decision", "remember"),
    [
        (
            mt.ElicitResult(action="accept", content={"decision": "allow", "remember": True}),
            Decision.ALLOW,
            True,
        ),
        (mt.ElicitResult(action="accept", content={"decision": "deny"}), Decision.DENY, False),
        (mt.ElicitResult(action="accept", content={}), Decision.ALLOW, False),
        (mt.ElicitResult(action="decline"), Decision.DENY, False),
        (mt.ElicitResult(action="cancel", content={"decision": "allow"}), Decision.DENY, False),
    ],
)
def test_answers_map_to_decisions(result: mt.ElicitResult, decision: Decision, remember: bool) -> None:
    assert approval.answer(result) == approval.Answer(decision, remember)


async def _stream(closed: list[str], name: str) -> AsyncGenerator[DispatchItem, None]:
    try:
        yield ToolResultBlock(name, ())
    finally:
        closed.append(name)


async def test_held_calls_are_bounded_and_each_key_is_good_once() -> None:
    closed: list[str] = []
    held = PendingCalls(2)
    calls = []
    for name in ("a", "b", "c"):
        items = _stream(closed, name)
        await anext(items)  # suspended at its yield, like a Dispatch waiting for an answer
        calls.append(Pending(name, items))
    keys = [held.park(c) for c in calls]
    assert len(held) == 2
    assert held.take(keys[0]) is None  # the oldest was dropped to make room
    assert held.take(keys[1]) is calls[1] and held.take(keys[1]) is None
    await until(lambda: "a" in closed, "the dropped call's stream to close")
    await held.aclose()
    assert len(held) == 0 and sorted(closed) == ["a", "c"]  # b was taken: its reader closes it
