"""Result shaping: head+tail truncation, secret redaction, the audit log file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dispatcher.core.audit import DENIED, AuditLog
from dispatcher.core.text.redact import REDACTED, redact, redact_text
from dispatcher.core.text.truncate import truncate_head_tail


@pytest.mark.parametrize("budget", [60, 100, 1000])
def test_truncation_keeps_head_and_tail_within_budget(budget: int) -> None:
    text = "".join(f"line {i}\n" for i in range(2000))
    out = truncate_head_tail(text, budget)
    assert len(out) <= budget
    assert out.startswith("line 0") and text.endswith(out[-5:])
    marker = re.search(r"\n\n\[\.\.\. ([\d,]+) characters truncated \.\.\.\]\n\n", out)
    assert marker is not None
    kept = len(out) - len(marker.group(0))
    assert int(marker.group(1).replace(",", "")) == len(text) - kept  # the marker tells exactly what was cut


def test_short_text_untouched() -> None:
    assert truncate_head_tail("abc", 10) == "abc"


@pytest.mark.parametrize(
    "secret",
    [
        "password=hunter2",
        "API_KEY=abcd1234",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefghijk",
        "sk-ant-api03-abcdefghijklmnopqrstuv",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "AKIAABCDEFGHIJKLMNOP",
        "postgres://user:s3cr3t@db/x",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----",
    ],
)
def test_free_text_secrets(secret: str) -> None:
    out = redact_text(f"run with {secret} now")
    assert REDACTED in out
    assert not any(
        part in out for part in ("hunter2", "abcd1234", "abcdefghijk", "s3cr3t", "MIIB", "AKIAABCD")
    )


def test_secret_named_keys_and_nesting() -> None:
    value = {
        "db_password": "x",
        "apiKey": "y",
        "max_tokens": 5,
        "path": "a.txt",
        "env": [{"GITHUB_TOKEN": "z"}],
    }
    assert redact(value) == {
        "db_password": REDACTED,
        "apiKey": REDACTED,
        "max_tokens": 5,
        "path": "a.txt",
        "env": [{"GITHUB_TOKEN": REDACTED}],
    }


def test_audit_log_appends_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "audit" / "audit.jsonl"
    log = AuditLog(str(path))
    log.record(DENIED, tool="shell", decision="policy_denied")
    log.close()
    again = AuditLog(str(path))
    again.record("tool.call.dispatched", tool="echo")
    again.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["kind"] for r in lines] == [DENIED, "tool.call.dispatched"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_audit_log_rotates_by_size_and_keeps_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), max_bytes=400, backups=2)
    for i in range(30):
        log.record("tool.call.dispatched", n=i, pad="x" * 40)
    log.close()
    files = [path, tmp_path / "audit.jsonl.1", tmp_path / "audit.jsonl.2"]
    assert all(f.exists() for f in files) and not (tmp_path / "audit.jsonl.3").exists()
    assert all(f.stat().st_size <= 400 for f in files)
    kept = [json.loads(line)["n"] for f in reversed(files) for line in f.read_text().splitlines()]
    assert kept == list(range(30 - len(kept), 30))  # the newest records, in order, none cut in half
