"""Proto <-> domain for the closed sets every other converter shares: side-effect class, error
class, decision, role, ordering and tool format.

Each enum maps by its domain name (``SideEffect.READ`` <-> ``SIDE_EFFECT_READ``). Their own module
so that the tool, session and event converters share one mapping each.
"""

from __future__ import annotations

from typing import Any

from dispatcher.core.approval.broker import Decision
from dispatcher.core.call.ordering import Ordering
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.tool_shapes import ToolFormat
from dispatcher.core.types import Role, SideEffect
from dispatcher.v1 import dispatcher_pb2 as pb

__all__ = [
    "decision_from_pb",
    "decision_to_pb",
    "error_class_from_pb",
    "error_class_to_pb",
    "ordering_from_pb",
    "ordering_to_pb",
    "role_from_pb",
    "role_to_pb",
    "side_effect_from_pb",
    "side_effect_to_pb",
    "tool_format_from_pb",
    "tool_format_to_pb",
]

_SIDE_EFFECT_TO_PB = {e: pb.SideEffect.Value(f"SIDE_EFFECT_{e.name}") for e in SideEffect}
_SIDE_EFFECT_FROM_PB: dict[int, SideEffect] = {v: k for k, v in _SIDE_EFFECT_TO_PB.items()}
_ERROR_TO_PB = {e: pb.ErrorClass.Value(f"ERROR_CLASS_{e.name}") for e in ToolErrorClass}
_ERROR_FROM_PB: dict[int, ToolErrorClass] = {v: k for k, v in _ERROR_TO_PB.items()}
_DECISION_TO_PB = {d: pb.Decision.Value(f"DECISION_{d.name}") for d in Decision}
_DECISION_FROM_PB: dict[int, Decision] = {v: k for k, v in _DECISION_TO_PB.items()}
_ROLE_TO_PB = {r: pb.Role.Value(f"ROLE_{r.name}") for r in Role}
_ROLE_FROM_PB: dict[int, Role] = {v: k for k, v in _ROLE_TO_PB.items()}


def side_effect_to_pb(value: Any) -> pb.SideEffect.ValueType:
    try:
        return _SIDE_EFFECT_TO_PB[SideEffect(str(value))]
    except ValueError:
        return pb.SIDE_EFFECT_UNSPECIFIED


def side_effect_from_pb(value: int) -> SideEffect | None:
    return _SIDE_EFFECT_FROM_PB.get(value)


def error_class_to_pb(value: Any) -> pb.ErrorClass.ValueType:
    if value is None:
        return pb.ERROR_CLASS_UNSPECIFIED
    try:
        return _ERROR_TO_PB[ToolErrorClass(str(value))]
    except ValueError:
        return pb.ERROR_CLASS_EXECUTION_ERROR


def error_class_from_pb(value: int) -> ToolErrorClass | None:
    return _ERROR_FROM_PB.get(value)


def decision_to_pb(value: Any) -> pb.Decision.ValueType:
    try:
        return _DECISION_TO_PB[Decision(str(value))]
    except ValueError:
        return pb.DECISION_UNSPECIFIED


def decision_from_pb(value: int) -> Decision | None:
    """None for DECISION_UNSPECIFIED or an unknown number."""
    return _DECISION_FROM_PB.get(value)


def role_to_pb(value: Role) -> pb.Role.ValueType:
    return _ROLE_TO_PB[value]


def role_from_pb(value: int) -> Role | None:
    """ROLE_UNSPECIFIED is MAIN; None for an unknown number."""
    if value == pb.ROLE_UNSPECIFIED:
        return Role.MAIN
    return _ROLE_FROM_PB.get(value)


_ORDERING_TO_PB = {
    Ordering.CONCURRENT: pb.ORDERING_CONCURRENT,
    Ordering.SEQUENTIAL: pb.ORDERING_SEQUENTIAL,
    Ordering.READS_CONCURRENT: pb.ORDERING_READS_CONCURRENT,
}
_ORDERING_FROM_PB = {v: k for k, v in _ORDERING_TO_PB.items()}


def ordering_to_pb(ordering: Ordering | str | None) -> pb.Ordering.ValueType:
    """UNSPECIFIED for None (the server then applies its default)."""
    return pb.ORDERING_UNSPECIFIED if ordering is None else _ORDERING_TO_PB[Ordering(ordering)]


def ordering_from_pb(value: int) -> Ordering | None:
    """None for UNSPECIFIED (the server's default).

    Raises:
        ValueError: a value this server does not know.
    """
    if value == pb.ORDERING_UNSPECIFIED:
        return None
    try:
        return _ORDERING_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"ordering: unknown value {value}") from None


_TOOL_FORMAT_TO_PB = {
    ToolFormat.OPENAI: pb.TOOL_FORMAT_OPENAI,
    ToolFormat.ANTHROPIC: pb.TOOL_FORMAT_ANTHROPIC,
    ToolFormat.MCP: pb.TOOL_FORMAT_MCP,
}
_TOOL_FORMAT_FROM_PB = {v: k for k, v in _TOOL_FORMAT_TO_PB.items()}


def tool_format_to_pb(format: ToolFormat | str | None) -> pb.ToolFormat.ValueType:
    """UNSPECIFIED for None (no provider shape).

    Raises:
        ValueError: a name that is not one of ``ToolFormat``'s.
    """
    return pb.TOOL_FORMAT_UNSPECIFIED if format is None else _TOOL_FORMAT_TO_PB[ToolFormat(format)]


def tool_format_from_pb(value: int) -> ToolFormat | None:
    """None for UNSPECIFIED.

    Raises:
        ValueError: a value this server does not know.
    """
    if value == pb.TOOL_FORMAT_UNSPECIFIED:
        return None
    try:
        return _TOOL_FORMAT_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"format: unknown value {value}") from None
