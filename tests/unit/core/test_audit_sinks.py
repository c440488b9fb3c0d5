"""Audit sinks: the file log and the in-memory one share an interface, not each other's state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.audit import DISPATCHED, AuditLog, AuditSink, MemoryAuditLog


def test_memory_log_is_a_sink_not_a_file_log() -> None:
    memory = MemoryAuditLog()
    assert isinstance(memory, AuditSink) and not isinstance(memory, AuditLog)
    memory.record(DISPATCHED, tool="shell")
    memory.close()
    memory.close()  # idempotent, and nothing of a file to close
    assert [r["kind"] for r in memory.records] == [DISPATCHED]


def test_file_log_is_a_sink(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    assert isinstance(log, AuditSink)
    log.record(DISPATCHED, tool="shell")
    log.close()
    log.close()
    assert '"tool": "shell"' in (tmp_path / "audit.jsonl").read_text()


def test_a_sink_must_say_where_records_go() -> None:
    class Nowhere(AuditSink):
        pass

    with pytest.raises(TypeError):
        Nowhere()  # type: ignore[abstract]

    class Counting(AuditSink):
        def __init__(self) -> None:
            self.count = 0

        def record(self, kind: str, **fields: Any) -> None:
            self.count += 1

    sink = Counting()
    sink.record(DISPATCHED)
    sink.close()
    assert sink.count == 1
