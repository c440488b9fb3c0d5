"""What each event type carries: one frozen dataclass per type, with typed fields.

An event's ``type`` comes from its payload's class, so the two cannot disagree. ``to_dict`` and
``payload_from_dict`` are the stored form (``<home>/state.db``): the same keys every version wrote,
with optional fields left out when empty.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

TOOL_CALLED: Final = "tool.called"
TOOL_OUTPUT_DELTA: Final = "tool.output_delta"
TOOL_COMPLETED: Final = "tool.completed"
TOOL_FAILED: Final = "tool.failed"
TOOL_INPUT_INVALID: Final = "tool.input_invalid"
TOOL_CONFIRMATION_REQUESTED: Final = "tool.confirmation_requested"
TOOL_CONFIRMATION_RESOLVED: Final = "tool.confirmation_resolved"
TOOL_STEP_PROPOSED: Final = "tool.step_proposed"
"""A ``plan`` session held back a call with side effects as a step of its plan (spec 004)."""
STAGED_APPLIED: Final = "staged.applied"
"""A human applied staged changes (review/audit mode); not a call's: its tool_use_id is ""."""
STAGED_DISCARDED: Final = "staged.discarded"
"""A human discarded staged changes; not a call's either."""
SESSION_EXPIRING: Final = "session.expiring"
SESSION_EXPIRED: Final = "session.expired"
SESSION_PAUSED: Final = "session.paused"
SESSION_RESUMED: Final = "session.resumed"
"""The session events (``core/sessions/expiry.py``): no call, so their turn and tool_use ids are empty;
``reason`` is ``ttl``, ``idle`` or ``request``."""
PROCESS_STARTED: Final = "process.started"
PROCESS_EXITED: Final = "process.exited"
"""A background process of the session started or ended (issue 32); their tool_use_id is the call
that started it ("" when none did). No output in events: read it with ``process_output`` or
``WatchProcess``."""


@dataclass(frozen=True, slots=True)
class ToolCalled:
    """The call passed validation, policy and confirmation and its tool starts (step 5)."""

    TYPE: ClassVar[str] = TOOL_CALLED
    tool_name: str
    side_effect: str | None
    input: Any
    """The input as events show it: bounded, secrets redacted (``display.summarize``)."""


@dataclass(frozen=True, slots=True)
class ToolOutputDelta:
    """A piece of a running tool's output."""

    TYPE: ClassVar[str] = TOOL_OUTPUT_DELTA
    stream: str  # stdout | stderr
    text: str


@dataclass(frozen=True, slots=True)
class ToolCompleted:
    TYPE: ClassVar[str] = TOOL_COMPLETED
    tool_name: str
    duration_ms: float


@dataclass(frozen=True, slots=True)
class ToolFailed:
    TYPE: ClassVar[str] = TOOL_FAILED
    tool_name: str
    error_class: str | None
    message: str
    duration_ms: float
    partial_output: str = ""
    """What the tool printed before it failed (timeout, cancel); "" when nothing."""
    reason: str = ""
    """Why, finer than the error class: a ``FailureReason`` value; "" when nothing. (Events stored
    before the values were slugs replay as written: ``server restarted``.)"""


@dataclass(frozen=True, slots=True)
class ToolInputInvalid:
    TYPE: ClassVar[str] = TOOL_INPUT_INVALID
    tool_name: str
    errors: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ToolConfirmationRequested:
    TYPE: ClassVar[str] = TOOL_CONFIRMATION_REQUESTED
    request_id: str
    tool_name: str
    input_summary: str
    """The whole input as a human approves it (escaped, never redacted or cut)."""
    side_effect: str | None
    projected_modifications: tuple[str, ...]
    diff: str = ""
    """Review mode: the staged write's unified diff; "" otherwise."""


@dataclass(frozen=True, slots=True)
class ToolStepProposed:
    TYPE: ClassVar[str] = TOOL_STEP_PROPOSED
    step: int
    tool_name: str
    input_summary: str
    side_effect: str | None
    projected_modifications: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ToolConfirmationResolved:
    TYPE: ClassVar[str] = TOOL_CONFIRMATION_RESOLVED
    request_id: str
    decision: str | None  # allow | deny
    reason: str  # client | timeout | cancelled | remembered


@dataclass(frozen=True, slots=True)
class StagedApplied:
    """``ApplyStagedChanges``: the changes written, and those refused (they stay staged)."""

    TYPE: ClassVar[str] = STAGED_APPLIED
    change_ids: tuple[str, ...]
    paths: tuple[str, ...]
    """The written files, workspace-relative, in the order of ``change_ids``."""
    refused_ids: tuple[str, ...] = ()
    refused_paths: tuple[str, ...] = ()
    refused_reasons: tuple[str, ...] = ()
    """Why each of ``refused_ids`` (at ``refused_paths``) was not written, in its order."""


@dataclass(frozen=True, slots=True)
class StagedDiscarded:
    """``DiscardStagedChanges``: the changes dropped; nothing of them was written."""

    TYPE: ClassVar[str] = STAGED_DISCARDED
    change_ids: tuple[str, ...]
    paths: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SessionExpiring:
    """A clock runs out soon (once per deadline): a client may renew, or use the session."""

    TYPE: ClassVar[str] = SESSION_EXPIRING
    reason: str
    seconds_left: float
    expire_time: float


@dataclass(frozen=True, slots=True)
class SessionExpired:
    """A clock ran out: the session is closed (or, with ``on_expire: pause``, paused)."""

    TYPE: ClassVar[str] = SESSION_EXPIRED
    reason: str


@dataclass(frozen=True, slots=True)
class SessionPaused:
    TYPE: ClassVar[str] = SESSION_PAUSED
    reason: str


@dataclass(frozen=True, slots=True)
class SessionResumed:
    TYPE: ClassVar[str] = SESSION_RESUMED
    reason: str


@dataclass(frozen=True, slots=True)
class ProcessStarted:
    TYPE: ClassVar[str] = PROCESS_STARTED
    process_id: str
    command: str
    """As events show inputs: bounded, secrets redacted."""
    pid: int
    origin: str
    """``background`` (``shell`` with ``background: true``) or ``left`` (a foreground command left it)."""


@dataclass(frozen=True, slots=True)
class ProcessExited:
    TYPE: ClassVar[str] = PROCESS_EXITED
    process_id: str
    state: str
    """``exited`` or ``killed``."""
    exit_code: int | None = None
    signal: int | None = None
    output_bytes: int = 0
    """Its output in all (the cursor after its last byte)."""


EventPayload = (
    ToolCalled
    | ToolOutputDelta
    | ToolCompleted
    | ToolFailed
    | ToolInputInvalid
    | ToolConfirmationRequested
    | ToolStepProposed
    | ToolConfirmationResolved
    | StagedApplied
    | StagedDiscarded
    | SessionExpiring
    | SessionExpired
    | SessionPaused
    | SessionResumed
    | ProcessStarted
    | ProcessExited
)

PAYLOAD_TYPES: Final[Mapping[str, type[EventPayload]]] = {
    cls.TYPE: cls
    for cls in (
        ToolCalled,
        ToolOutputDelta,
        ToolCompleted,
        ToolFailed,
        ToolInputInvalid,
        ToolConfirmationRequested,
        ToolStepProposed,
        ToolConfirmationResolved,
        StagedApplied,
        StagedDiscarded,
        SessionExpiring,
        SessionExpired,
        SessionPaused,
        SessionResumed,
        ProcessStarted,
        ProcessExited,
    )
}
EVENT_TYPES: Final = frozenset(PAYLOAD_TYPES)


def to_dict(payload: EventPayload) -> dict[str, Any]:
    """The stored (JSON) form: field name -> value, tuples as lists, empty optional fields left out."""
    out: dict[str, Any] = {}
    for name, default in _defaults(type(payload)):
        value = getattr(payload, name)
        if default is not dataclasses.MISSING and value == default:
            continue  # optional and empty: older rows never had it
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


_DEFAULTS: dict[type, tuple[tuple[str, Any], ...]] = {}


def _defaults(cls: type) -> tuple[tuple[str, Any], ...]:
    """(name, default) of each field of a payload class (looked up once per class, not per event)."""
    found = _DEFAULTS.get(cls)
    if found is None:
        found = _DEFAULTS[cls] = tuple((f.name, f.default) for f in dataclasses.fields(cls))
    return found


def payload_from_dict(type: str, data: Mapping[str, Any]) -> EventPayload:
    """The payload of a stored event.

    Raises:
        ValueError: an unknown type, a missing field, or a field of the wrong kind (a damaged row).
    """
    cls = PAYLOAD_TYPES.get(type)
    if cls is None:
        raise ValueError(f"unknown event type {type!r}")
    if not isinstance(data, Mapping):
        raise ValueError(f"{type}: the payload is not an object")
    kwargs: dict[str, Any] = {}
    for name, declared, required in _fields(cls):
        if name not in data:
            if required:
                raise ValueError(f"{type}: field {name!r} is missing")
            continue
        kwargs[name] = _checked(type, name, declared, data[name])
    return cls(**kwargs)


_KINDS: Final[Mapping[type, tuple[str, str]]] = {
    str: ("a string", "strings"),
    int: ("an integer", "integers"),
    float: ("a number", "numbers"),
}
"""The field types a payload may declare (alone, ``X | None`` or ``tuple[X, ...]``), as messages name them."""


_FIELDS: dict[type[Any], tuple[tuple[str, Any, bool], ...]] = {}


def _fields(cls: type[Any]) -> tuple[tuple[str, Any, bool], ...]:
    """(name, resolved type, required) of each field: the annotations are strings in this module,
    resolved once per class on first use."""
    fields = _FIELDS.get(cls)
    if fields is None:
        hints = typing.get_type_hints(cls)
        fields = tuple(
            (f.name, hints[f.name], f.default is dataclasses.MISSING) for f in dataclasses.fields(cls)
        )
        _FIELDS[cls] = fields
    return fields


def _checked(type: str, name: str, declared: Any, value: Any) -> Any:
    """``value`` as field ``name`` declares it.

    Raises:
        ValueError: ``value`` is not of the declared type (a bool is no number here).
        TypeError: the payload declares a type this reader does not know (a bug, not a damaged row).
    """
    if declared is Any:
        return value
    args = typing.get_args(declared)
    if isinstance(declared, types.UnionType):
        if value is None and types.NoneType in args:
            return None
        declared, *others = (a for a in args if a is not types.NoneType)
        if others:
            raise TypeError(f"{type}.{name}: unions other than X | None are not read")
        args = typing.get_args(declared)
    if typing.get_origin(declared) is tuple:
        item = args[0]
        if not isinstance(value, list | tuple) or not all(_is(item, v) for v in value):
            raise ValueError(f"{type}: field {name!r} is not a list of {_kind(item)[1]}")
        return tuple(value)
    if not _is(declared, value):
        raise ValueError(f"{type}: field {name!r} is not {_kind(declared)[0]}")
    return float(value) if declared is float else value


def _kind(declared: Any) -> tuple[str, str]:
    kind = _KINDS.get(declared)
    if kind is None:
        raise TypeError(f"an event payload field of type {declared!r} is not read")
    return kind


def _is(declared: Any, value: Any) -> bool:
    _kind(declared)
    if isinstance(value, bool):  # JSON true is no count or duration
        return False
    return isinstance(value, int | float) if declared is float else isinstance(value, declared)
