"""Append-only JSONL audit log of every dispatched and denied call (spec 003 §1.5).

A call the policy lets through gets ``tool.call.dispatched`` (with its redacted input) before the
tool starts, so a call still running when the server dies has left its trace, and
``tool.call.completed`` (same fields plus outcome and duration) when it ends, however it ends. A
call refused before it runs gets one ``tool.call.denied``, and so does one the sandbox refused while
it ran (a path escaping the workspace or outside the grants, found only where the files are). Every
final record carries the call's ``reason`` slug (``FailureReason``; empty when it succeeded), and a
refusal's ``decision`` names what refused it. A human's apply or discard of staged
changes (review and audit modes) is not a call: it gets one ``staged.applied`` or
``staged.discarded`` record, with the change ids and paths.
"""

from __future__ import annotations

import abc
import json
import os
import threading
import time
from enum import StrEnum
from typing import Any, Final

DISPATCHED: Final = "tool.call.dispatched"
DENIED: Final = "tool.call.denied"
COMPLETED: Final = "tool.call.completed"
STAGED_APPLIED: Final = "staged.applied"
"""A human applied staged changes (review/audit mode): which were written, which refused and why."""
STAGED_DISCARDED: Final = "staged.discarded"
"""A human discarded staged changes: nothing of them was written."""

# One encoder for every record: ``json.dumps`` with options builds a new encoder per call.
_encode = json.JSONEncoder(default=str, ensure_ascii=False).encode


class AuditDecision(StrEnum):
    """A record's ``decision``: how the call was let through or refused. A closed set; each value is
    the string the records have always carried, so their readers see no difference."""

    AUTO = "auto"  # the policy let it run unasked
    AUDIT = "audit"  # audit mode: ran unasked, on record for later review
    ALLOW = "allow"  # a human allowed it when asked
    DENY = "deny"  # a human denied it when asked
    REMEMBERED_ALLOW = "remembered_allow"  # an earlier answer, remembered for the session
    REMEMBERED_DENY = "remembered_deny"
    REVIEW_ALLOW = "review_allow"  # earlier releases: review mode asked per write (now staged)
    REVIEW_DENY = "review_deny"  # ... and it was rejected; neither is written any more
    STAGED = "staged"  # review/audit mode: the write was staged, not run (applied later by a human)
    PLAN_PROPOSED = "plan_proposed"  # plan mode: recorded as a step, not run
    PLAN_FULL = "plan_full"  # plan mode: the plan is full, neither run nor recorded
    POLICY_DENIED = "policy_denied"  # the confirmation policy denies the tool
    CAPABILITY_DENIED = "capability_denied"  # not among the session's tools
    FS_DENIED = "fs_denied"  # a path outside the session's grants
    WORKSPACE_ESCAPE = "workspace_escape"  # a path leading out of the workspace (lexically, by a
    # link, or refused inside the sandbox while the call ran)
    TOOL_NOT_FOUND = "tool_not_found"  # no such tool, or hidden from the session's role
    INVALID_ARGS = "invalid_args"  # the input is not JSON, or not the tool's schema
    INPUT_TOO_LARGE = "input_too_large"  # the input is over ``dispatcher.max_input_bytes``
    CANCELLED = "cancelled"  # its dispatch was cancelled before it ran
    SANDBOX_FAILED = "sandbox_failed"  # the sandbox broke while checking its paths
    TOO_LONG_TO_CONFIRM = "too_long_to_confirm"  # its input is too long to show a human whole
    CONFIRMATION_TIMEOUT = "confirmation_timeout"  # nobody answered in time
    CLIENT = "client"  # a tree transfer the client asked for: nobody is asked


class AuditSink(abc.ABC):
    """Where audit records go; the pipeline and the dispatcher depend on this, not on a file."""

    @abc.abstractmethod
    def record(self, kind: str, **fields: Any) -> None:
        """Append one record; ``fields`` must already be redacted."""

    def close(self) -> None:  # noqa: B027 - nothing to release unless a subclass holds a resource
        """Stop recording; idempotent."""


class AuditLog(AuditSink):
    """One JSON object per line; lines are only ever appended, never rewritten.

    When the file would pass ``max_bytes`` it is renamed to ``<path>.1`` (older ones shift up to
    ``<path>.<backups>``, the oldest is dropped) and a new file is started, so a long-running
    server's audit trail stays bounded on disk without losing a record mid-line.
    """

    def __init__(self, path: str, *, max_bytes: int = 64 << 20, backups: int = 5) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._size = 0
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        for i in range(self.backups - 1, 0, -1):
            older = f"{self.path}.{i}"
            if os.path.exists(older):
                os.replace(older, f"{self.path}.{i + 1}")
        if self.backups > 0:
            os.replace(self.path, f"{self.path}.1")
        else:
            os.unlink(self.path)
        self._open()

    def record(self, kind: str, **fields: Any) -> None:
        """Append one record; ``fields`` must already be redacted."""
        line = (_encode({"time": time.time(), "kind": kind, **fields}) + "\n").encode("utf-8")
        size = len(line)
        with self._lock:
            if self._fd is None:
                return
            if self._size and self._size + size > self.max_bytes:
                self._rotate()
                assert self._fd is not None
            # One write per record, straight to the kernel (O_APPEND: whole lines, never
            # interleaved): the record is in the file before the tool it announces starts.
            written = os.write(self._fd, line)
            while written < size:  # a regular file takes it whole; a full disk raises instead
                written += os.write(self._fd, line[written:])
            self._size += size

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class MemoryAuditLog(AuditSink):
    """Keeps records in memory; for tests and for running without a state directory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.records: list[dict[str, Any]] = []

    def record(self, kind: str, **fields: Any) -> None:
        with self._lock:
            self.records.append({"time": time.time(), "kind": kind, **fields})
