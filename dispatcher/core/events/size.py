"""How much memory an event holds, estimated from above: history, backlogs and the state writer
bound what they keep by it, and every event is sized once, when it is published."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatcher.core.events.payloads import EventPayload

__all__ = ["estimate_bytes", "event_bytes"]


def estimate_bytes(value: Any) -> int:
    """An estimate, from above, of the memory ``value`` holds; walks containers without recursion."""
    total = 0
    stack = [value]
    seen: set[int] = set()
    while stack:
        item = stack.pop()
        cls = type(item)
        # Exact types first: nearly every leaf is one, and an ABC check costs several times more.
        if cls is str or cls is bytes:
            total += sys.getsizeof(item)
        elif cls in _SCALARS:
            total += 32
        elif isinstance(item, str | bytes):
            total += sys.getsizeof(item)
        elif (names := _field_names(cls)) is not None:
            if id(item) in seen:
                continue
            seen.add(id(item))
            total += sys.getsizeof(item)
            stack.extend(getattr(item, name) for name in names)
        elif isinstance(item, Mapping | list | tuple | set | frozenset):
            if id(item) in seen:
                continue
            seen.add(id(item))
            total += sys.getsizeof(item)
            if isinstance(item, Mapping):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
        else:
            total += 32
    return total


def event_bytes(turn_id: str, tool_use_id: str, payload: EventPayload) -> int:
    """``estimate_bytes((turn_id, tool_use_id, payload))`` for an event being published, without
    the walk's stack and seen-set for the payload's plain fields (every event is sized)."""
    total = _TRIPLE_BYTES + sys.getsizeof(turn_id) + sys.getsizeof(tool_use_id) + sys.getsizeof(payload)
    names = _field_names(type(payload))
    if names is None:
        return total - sys.getsizeof(payload) + estimate_bytes(payload)
    for name in names:
        value = getattr(payload, name)
        cls = type(value)
        if cls is str:
            total += sys.getsizeof(value)
        elif cls in _SCALARS:
            total += 32
        else:
            total += estimate_bytes(value)
    return total


_SCALARS: frozenset[type] = frozenset({int, float, bool, type(None)})
_TRIPLE_BYTES = sys.getsizeof((0, 0, 0))
_FIELD_NAMES: dict[type, tuple[str, ...] | None] = {}


def _field_names(cls: type) -> tuple[str, ...] | None:
    """The field names of a dataclass type (None: not one), looked up once per type: every event
    is sized at publish, and ``dataclasses.fields`` per object was a visible share of it."""
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        names = (
            tuple(f.name for f in dataclasses.fields(cls))
            if dataclasses.is_dataclass(cls) and not issubclass(cls, type)
            else None
        )
        _FIELD_NAMES[cls] = names
        return names
