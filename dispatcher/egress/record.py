"""What each connection attempt leaves for operators: one audit record and its metrics.

Metric labels come from closed sets only: the tenant (from the config), the outcome (``Outcome``)
and the direction (``Direction``); a host never becomes a label, so a sandbox cannot grow the
series. The server implements ``EgressObserver`` with Prometheus counters
(``dispatcher_egress_connections_total{tenant,decision}``,
``dispatcher_egress_bytes_total{tenant,direction}``) and ``AuditRecorder`` with its audit log.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = [
    "AUDIT_KIND",
    "NO_OBSERVER",
    "AuditRecorder",
    "Direction",
    "EgressAttempt",
    "EgressObserver",
    "End",
    "Outcome",
    "report",
]

AUDIT_KIND: Final = "egress.connection"


class Outcome(enum.StrEnum):
    """The ``decision`` label: let through, refused by policy or bounds, or allowed but failed."""

    ALLOWED = "allowed"
    REFUSED = "refused"
    FAILED = "failed"
    """A malformed request, a name that does not resolve, a destination that does not answer."""


class Direction(enum.StrEnum):
    OUT = "out"
    """From the sandbox to the destination."""
    IN = "in"
    """From the destination to the sandbox."""


class End(enum.StrEnum):
    """How an allowed tunnel ended."""

    CLOSED = "closed"
    IDLE = "idle_timeout"
    BYTES_QUOTA = "bytes_quota"
    CANCELLED = "cancelled"
    """The session closed or expired, or the call that opened it was cancelled."""
    ERROR = "error"


class AuditRecorder(Protocol):
    """``dispatcher.core.audit.AuditSink`` fits."""

    def record(self, kind: str, **fields: Any) -> None: ...


class EgressObserver(Protocol):
    """Told about every attempt and every relayed chunk; must not block or raise."""

    def egress_connection(self, tenant: str, decision: str) -> None: ...

    def egress_bytes(self, tenant: str, direction: str, count: int) -> None: ...


class _NoObserver:
    def egress_connection(self, tenant: str, decision: str) -> None:
        pass

    def egress_bytes(self, tenant: str, direction: str, count: int) -> None:
        pass


NO_OBSERVER: Final[EgressObserver] = _NoObserver()


@dataclass(frozen=True, slots=True)
class EgressAttempt:
    """One connection attempt, as audited."""

    tenant: str
    session_id: str
    tool_use_id: str | None
    host: str
    """Normalised; empty when the request was refused before it was read (a quota)."""
    port: int
    address: str | None
    """The address connected to; None when no connection was made."""
    outcome: Outcome
    reason: str
    """A ``policy.Reason`` value."""
    bytes_out: int
    bytes_in: int
    seconds: float
    method: str = ""
    """``CONNECT`` or the forwarded HTTP method."""
    end: End | None = None
    """How an allowed tunnel ended (None: it never opened)."""


def report(attempt: EgressAttempt, audit: AuditRecorder | None, observer: EgressObserver) -> None:
    """The audit record and the connection counter of one finished attempt."""
    if audit is not None:
        audit.record(
            AUDIT_KIND,
            tenant=attempt.tenant,
            session_id=attempt.session_id,
            tool_use_id=attempt.tool_use_id,
            host=attempt.host,
            port=attempt.port,
            address=attempt.address,
            method=attempt.method,
            decision=attempt.outcome.value,
            reason=attempt.reason,
            bytes_out=attempt.bytes_out,
            bytes_in=attempt.bytes_in,
            duration_seconds=round(attempt.seconds, 6),
            end=attempt.end.value if attempt.end is not None else None,
        )
    observer.egress_connection(attempt.tenant, attempt.outcome.value)
