"""Append-only JSONL audit log of every dispatched and denied call (spec 003 §1.5)."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Final, TextIO

DISPATCHED: Final = "tool.call.dispatched"
DENIED: Final = "tool.call.denied"


class AuditLog:
    """One JSON object per line; the file is opened for append and never rewritten."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._file: TextIO | None = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def record(self, kind: str, **fields: Any) -> None:
        """Append one record; ``fields`` must already be redacted."""
        line = json.dumps({"time": time.time(), "kind": kind, **fields}, default=str, ensure_ascii=False)
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class MemoryAuditLog(AuditLog):
    """Keeps records in memory; for tests and for running without a state directory."""

    def __init__(self) -> None:
        self.path = ""
        self._lock = threading.Lock()
        self._file = None
        self.records: list[dict[str, Any]] = []

    def record(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self.records.append({"time": time.time(), "kind": kind, **fields})
