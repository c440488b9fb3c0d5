"""What a human approving a call sees (whole, exact, escapes made visible) and what logs get (bounded)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dispatcher.core import (
    ConfirmationPolicy,
    Decision,
    MemoryAuditLog,
    Session,
    ToolDispatcher,
    ToolErrorClass,
)
from dispatcher.core.dispatcher import DispatcherConfig
from dispatcher.core.events import bus as ev
from dispatcher.core.text.display import (
    SUMMARY_DEPTH,
    SUMMARY_STRING_CHARS,
    SUMMARY_TOTAL_CHARS,
    SUMMARY_VALUES,
    confirmation_text,
    summarize,
)
from dispatcher.core.text.redact import REDACTED
from dispatcher.core.types import ToolUseBlock
from dispatcher.sandbox.fake import FakeSandboxProvider
from dispatcher.tools.shell import ShellTool
from tests.events import ToolConfirmationRequested
from tests.unit.core.toolkit import WriteTool, next_event

COMMAND = "echo build ok password=$(touch /workspace/X)"


def test_a_shell_command_is_shown_exactly_and_unredacted() -> None:
    shown = confirmation_text("shell", {"command": COMMAND})
    header, body = shown.text.split("\n", 1)
    assert body == COMMAND and REDACTED not in shown.text
    assert header == f"shell command, {len(COMMAND)} characters, shown exactly:"
    assert (shown.chars, shown.escaped, shown.too_long) == (len(COMMAND), 0, False)


def test_a_long_multi_line_command_is_shown_whole() -> None:
    command = "\n".join(f"echo line {i} $HOME \\n" for i in range(300))
    assert len(command) > 5_000
    assert confirmation_text("shell", {"command": command}).text.split("\n", 1)[1] == command


def test_control_and_bidi_characters_are_shown_escaped_and_counted() -> None:
    shown = confirmation_text("shell", {"command": "ls\r\u202e# safe \\r\n"})
    header, body = shown.text.split("\n", 1)
    assert body == "ls\\r\\u202e# safe \\\\r\n"  # a typed backslash is doubled: no escape can be forged
    assert shown.escaped == 2 and "2 shown escaped" in header


def test_other_keys_of_a_shell_call_are_in_the_header() -> None:
    shown = confirmation_text("shell", {"command": "true", "timeout_seconds": 5})
    assert shown.text == 'shell command, 4 characters, with {"timeout_seconds": 5}, shown exactly:\ntrue'


def test_other_tools_show_their_input_as_json() -> None:
    data = {"path": "a.txt", "content": "x\u2067y\n", "token": "t0ps3cret"}
    shown = confirmation_text("write_file", data)
    header, body = shown.text.split("\n", 1)
    assert json.loads(body) == data and "t0ps3cret" in body and "\\u2067" in body
    assert shown.escaped == 1 and header.startswith("input as JSON")


def test_too_long_is_said_with_its_size() -> None:
    shown = confirmation_text("shell", {"command": "x" * 101}, limit=100)
    assert shown.too_long and "101 in all, too long to show (at most 100)" in shown.text


def test_summary_is_bounded_in_depth_values_and_characters() -> None:
    deep: Any = "leaf"
    for _ in range(SUMMARY_DEPTH + 10):
        deep = [deep]
    text = json.dumps(summarize({"deep": deep}))
    assert f"nested deeper than {SUMMARY_DEPTH} levels" in text and "leaf" not in text
    many = summarize(list(range(SUMMARY_VALUES * 5)))
    assert len(many) <= SUMMARY_VALUES + 1 and "more items" in many[-1]
    big = summarize([f"{i:06d}" * 1000 for i in range(100)])
    assert sum(len(s) for s in big) < SUMMARY_TOTAL_CHARS + 100 * 40
    assert len(big[0]) < SUMMARY_STRING_CHARS + 40


def test_summary_redacts_a_secret_across_the_cut() -> None:
    text = "x" * (SUMMARY_STRING_CHARS - 5) + " sk-ant-api03-abcdefghijklmnopqrstuv"
    assert "sk-ant" not in summarize(text) and "abcdef" not in summarize(text)
    assert summarize({"db_password": "p", "apiKey": "k"}) == {"db_password": REDACTED, "apiKey": REDACTED}


async def test_the_pipeline_asks_with_the_whole_input_and_logs_it_redacted(tmp_path: Any) -> None:
    audit = MemoryAuditLog()
    d = ToolDispatcher(FakeSandboxProvider(), audit=audit, policy=ConfirmationPolicy())
    d.register(ShellTool)
    session = Session(session_id="s1", workspace_path=str(tmp_path), tenant_id="t1")
    async with d.open_session(session).subscribe() as sub:
        task = asyncio.create_task(d.dispatch(ToolUseBlock("tu", "shell", {"command": COMMAND}), session))
        asked = await next_event(sub, ToolConfirmationRequested)
        d.resolve_confirmation("s1", asked.payload.request_id, Decision.DENY)
        result = await task
    assert asked.payload.input_summary.split("\n", 1)[1] == COMMAND
    assert result.error_class is ToolErrorClass.USER_DENIED
    assert audit.records[-1]["input"] == {"command": "echo build ok password=[REDACTED] /workspace/X)"}
    await d.aclose()


async def test_an_input_too_long_to_show_is_refused_without_asking(tmp_path: Any) -> None:
    audit = MemoryAuditLog()
    config = DispatcherConfig(confirmation_max_chars=1_000)
    d = ToolDispatcher(FakeSandboxProvider(), config=config, audit=audit, policy=ConfirmationPolicy())
    d.register(WriteTool)
    session = Session(session_id="s1", workspace_path=str(tmp_path), tenant_id="t1")
    result = await d.dispatch(ToolUseBlock("tu", "write", {"path": "a", "content": "x" * 2_000}), session)
    assert result.error_class is ToolErrorClass.PERMISSION_DENIED
    assert "shows at most 1,000" in str(getattr(result.content[0], "text", ""))
    history = list(d.events("s1").subscribe(after_seq=0)._pending)
    assert ev.TOOL_CONFIRMATION_REQUESTED not in [e.type for e in history]
    assert audit.records[-1]["decision"] == "too_long_to_confirm"
    await d.aclose()
