"""Structured logs of a real ``dispatcher serve`` (issue 9 point 5): ``log: {format: json}`` gives
one JSON object per line, and a line written during a tool call carries its ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.types import ToolUseBlock
from tests.polling import until_sync
from tests.server.serve_process import ServeProcess, start_serve


def serve_with(tmp_path: Path, fmt: str) -> ServeProcess:
    return start_serve(
        tmp_path,
        data={
            "sandbox": {"backend": "local"},
            "log": {"format": fmt, "level": "info"},
            "tools": ["tests.server.log_tools:make_log_tool"],
        },
    )


def said(serve: ServeProcess) -> tuple[str, str]:
    with serve.client() as client:
        session = client.create_session()
        results = list(
            client.dispatch(session.session_id, [ToolUseBlock("tu_log", "say", {"text": "hi"})], turn_id="t1")
        )
        assert results and not getattr(results[-1], "is_error", True)
    return session.session_id, "tu_log"


@pytest.mark.parametrize("fmt", ["json"])
def test_json_log_lines_carry_the_ids_of_the_call(tmp_path: Path, fmt: str) -> None:
    serve = serve_with(tmp_path, fmt)
    try:
        session_id, tool_use_id = said(serve)

        def lines() -> list[dict[str, Any]]:
            return [json.loads(line) for line in list(serve.stderr) if line.startswith("{")]

        until_sync(lambda: sum("logger: hi" in r["message"] for r in lines()) == 2, "both log lines")
        for record in (r for r in lines() if "logger: hi" in r["message"]):
            assert record["level"] == "warning" and record["time"].endswith("Z")
            assert record["tenant"] == "default" and record["session"] == session_id
            assert (record["tool_use_id"], record["tool"]) == (tool_use_id, "say"), record
        # Every line on stderr but the human ready line is one JSON object.
        for line in serve.stderr:
            assert line.startswith("dispatcher: ") or isinstance(json.loads(line), dict), line
    finally:
        serve.close()


def test_text_log_lines_carry_the_ids_too(tmp_path: Path) -> None:
    serve = serve_with(tmp_path, "text")
    try:
        session_id, tool_use_id = said(serve)
        until_sync(lambda: any("plain logger: hi" in line for line in list(serve.stderr)), "the log line")
        line = next(line for line in list(serve.stderr) if "plain logger: hi" in line)
        assert f"session={session_id}" in line and f"tool_use_id={tool_use_id}" in line and "tool=say" in line
    finally:
        serve.close()
