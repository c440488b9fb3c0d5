"""Structured logs: one JSON object per line with the ids passed as extras."""

from __future__ import annotations

import io
import json
import logging

from dispatcher.server.observability.logs import JsonFormatter, TextFormatter


def _record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("dispatcher.test")
    return logger.makeRecord(
        "dispatcher.test", logging.INFO, __file__, 1, "hello %s", ("world",), None, extra=extra
    )


def test_json_lines_carry_ids() -> None:
    line = JsonFormatter().format(_record(session_id="ses_1", tool_use_id="tu_1"))
    obj = json.loads(line)
    assert obj["message"] == "hello world" and obj["level"] == "info" and obj["logger"] == "dispatcher.test"
    assert (obj["session"], obj["tool_use_id"]) == ("ses_1", "tu_1")
    assert "\n" not in line


def test_exceptions_stay_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "failed", (), __import__("sys").exc_info()
        )
    obj = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in obj["exc"]


def test_text_format_for_people() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    handler.emit(_record(session_id="ses_1"))
    assert "dispatcher.test: hello world session=ses_1" in stream.getvalue()
