"""Structured logging: one JSON object per line in production, readable lines for people.

Every line carries the ids of what was being done when it was written, where known: ``tenant``,
``session``, ``tool_use_id``, ``tool`` and ``trace_id``. They come from the task's log context
(core/observe.py: set for each tool call, and per RPC when tracing is on) and from ``extra=``
fields (``session_id`` and ``tenant_id`` there are printed as ``session`` and ``tenant``); both
formats print every such field, so a log line can always be tied to its session and call.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

from dispatcher.core.observe import log_context

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


_RENAMED = {"session_id": "session", "tenant_id": "tenant"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = dict(log_context.get())
    for k, v in vars(record).items():
        if k not in _STANDARD and not k.startswith("_"):
            out[_RENAMED.get(k, k)] = v
    return out


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", ...extras, "exc"?}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``HH:MM:SS level logger: message key=value ...`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{time.strftime('%H:%M:%S', time.localtime(record.created))} {record.levelname.lower():7} "
        line += f"{record.name}: {record.getMessage()}" + (f" {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(fmt: Literal["json", "text"], level: str) -> None:
    """Send the ``dispatcher`` loggers to stderr in the chosen format (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("dispatcher")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
