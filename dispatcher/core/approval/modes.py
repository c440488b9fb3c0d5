"""The names of the approval modes (spec 004), apart from what they do (``core/call/approve.py``): clients,
the config and the wire name a mode without loading the pipeline's approval step."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ApprovalMode", "parse_mode"]


class ApprovalMode(StrEnum):
    """Spec 004's approval modes; one vocabulary with ``tool_confirmation.preset``."""

    CAUTIOUS = "cautious"
    AUTONOMOUS = "autonomous"
    MANUAL = "manual"
    PLAN = "plan"
    REVIEW = "review"
    AUDIT = "audit"


def parse_mode(name: str | None) -> ApprovalMode:
    """The mode named ``name`` ("" or None: cautious).

    Raises:
        ValueError: unknown name.
    """
    if not name:
        return ApprovalMode.CAUTIOUS
    try:
        return ApprovalMode(name.lower())
    except ValueError:
        raise ValueError(
            f"unknown approval mode {name!r} (one of {[m.value for m in ApprovalMode]})"
        ) from None
