"""Events whose payload type a test knows: ``Event.payload`` is the union of every payload, so a
test that reads ``failed.payload.error_class`` first says which kind it holds, once, with a check.

    request = await next_event(client, sid, ToolConfirmationRequested)  # tests/server/helpers.py
    request.payload.request_id                                          # typed, no union
    assert is_event(event, ToolFailed) and event.payload.reason == "cancelled"
    resolved = events_of(items, ToolConfirmationResolved)

The payload classes are imported from here, so tests name the module that defines them once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeGuard, TypeVar

from dispatcher.core.events.bus import Event, EventPayload
from dispatcher.core.events.payloads import (
    SessionExpired,
    SessionExpiring,
    SessionPaused,
    SessionResumed,
    StagedApplied,
    StagedDiscarded,
    ToolCalled,
    ToolCompleted,
    ToolConfirmationRequested,
    ToolConfirmationResolved,
    ToolFailed,
    ToolInputInvalid,
    ToolOutputDelta,
    ToolStepProposed,
)

__all__ = [
    "EventOf",
    "SessionExpired",
    "SessionExpiring",
    "SessionPaused",
    "SessionResumed",
    "StagedApplied",
    "StagedDiscarded",
    "ToolCalled",
    "ToolCompleted",
    "ToolConfirmationRequested",
    "ToolConfirmationResolved",
    "ToolFailed",
    "ToolInputInvalid",
    "ToolOutputDelta",
    "ToolStepProposed",
    "event_of",
    "events_of",
    "is_event",
]

P = TypeVar("P", bound=EventPayload, covariant=True)
Q = TypeVar("Q", bound=EventPayload)


class EventOf(Protocol[P]):
    """An ``Event`` (core/events/bus.py) whose payload is known to be a ``P``."""

    @property
    def seq(self) -> int: ...
    @property
    def time(self) -> float: ...
    @property
    def session_id(self) -> str: ...
    @property
    def turn_id(self) -> str: ...
    @property
    def tool_use_id(self) -> str: ...
    @property
    def payload(self) -> P: ...
    @property
    def type(self) -> str: ...


def is_event(item: object, kind: type[Q]) -> TypeGuard[EventOf[Q]]:
    """Whether ``item`` is an event with a ``kind`` payload (a client's stream mixes in results)."""
    return isinstance(item, Event) and isinstance(item.payload, kind)


def event_of(item: object, kind: type[Q]) -> EventOf[Q]:
    """``item``, which must be an event with a ``kind`` payload.

    Raises:
        AssertionError: it is not.
    """
    assert is_event(item, kind), f"expected a {kind.__name__} event, got {item!r}"
    return item


def events_of(items: Iterable[object], kind: type[Q]) -> list[EventOf[Q]]:
    """The events of ``items`` with a ``kind`` payload, in order."""
    return [item for item in items if is_event(item, kind)]
