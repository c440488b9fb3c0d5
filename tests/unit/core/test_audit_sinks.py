"""Audit sinks: the file log and the in-memory one share an interface, not each other's state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.audit import DISPATCHED, AuditDecision, AuditLog, AuditSink, MemoryAuditLog


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


# Every decision a record has carried, as its readers know them (issue 19: a closed set now).
DECISIONS_ON_RECORD = {
    "auto",
    "audit",
    "allow",
    "deny",
    "remembered_allow",
    "remembered_deny",
    "review_allow",
    "review_deny",
    "staged",  # issue 22: review and audit modes stage writes
    "plan_proposed",
    "plan_full",
    "policy_denied",
    "capability_denied",
    "fs_denied",
    "too_long_to_confirm",
    "confirmation_timeout",
    "client",
    # issue 37: a refusal before the policy step names what refused it, not "auto"
    "workspace_escape",
    "tool_not_found",
    "invalid_args",
    "input_too_large",
    "cancelled",
    "sandbox_failed",
}


def test_the_decision_vocabulary_is_closed_and_unchanged() -> None:
    assert {d.value for d in AuditDecision} == DECISIONS_ON_RECORD
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert all(f"`{d.value}`" in readme for d in AuditDecision)


def test_a_decision_is_written_as_the_same_bytes_as_its_string(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dispatcher.core.audit.time.time", lambda: 1.5)
    lines = []
    for i, decision in enumerate((AuditDecision.REMEMBERED_ALLOW, "remembered_allow")):
        log = AuditLog(str(tmp_path / f"{i}.jsonl"))
        log.record(DISPATCHED, tool="shell", decision=decision)
        log.close()
        lines.append((tmp_path / f"{i}.jsonl").read_bytes())
    assert (
        lines[0]
        == lines[1]
        == b'{"time": 1.5, "kind": "tool.call.dispatched", "tool": "shell", "decision": "remembered_allow"}\n'
    )
