"""How a message travels: the frame codec, and the generic codec that turns a frozen dataclass into
a frame header (its fields) and payload (its ``bytes`` field) and back, checking every field.

``protocol.py`` holds the schema (the messages) and re-exports what the host needs from here.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NoReturn, TypeVar, cast

PREFIX = struct.Struct(">II")

Count = int
"""An int that must not be negative (a size, a limit, a number of things)."""
Env = dict[str, str]
"""Environment variables: a JSON object of str to str (names without ``=`` or NUL)."""
CHUNK = 64 * 1024
"""The largest payload of a data frame (exec's output, a tunnel's bytes)."""


class ProtocolError(Exception):
    """A frame broke the protocol; the stream cannot be trusted any more."""


class BadMessage(ProtocolError):
    """A well-framed message whose fields break the schema (on the agent: a ``bad_request``)."""


def check_env(env: Mapping[str, Any]) -> None:
    """Refuse environment variables a process could not be given (``Env``'s rules)."""
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or type(value) is not str or "\x00" in value:
            raise BadMessage(f"bad environment variable {key!r}")


def check_relative(path: str, what: str) -> None:
    """Refuse a path that is not relative and inside the workspace."""
    if posixpath.isabs(path) or ".." in path.split("/") or "\x00" in path:
        raise BadMessage(f"{what} is not a relative path inside the workspace")


JOIN_BELOW = 16 << 10
"""A payload smaller than this is copied onto its frame's head and written with it; a larger one is
written after it, as it is (one more write costs less than copying a tunnel chunk or a file)."""


def frame_writes(header: Mapping[str, Any], payload: bytes = b"") -> tuple[bytes, ...]:
    """Serialise one frame as the writes that put it on a stream, in order."""
    # ASCII escapes keep any str encodable, lone surrogates from odd file names included.
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("ascii")
    head = PREFIX.pack(len(raw), len(payload)) + raw
    return (head + payload,) if len(payload) < JOIN_BELOW else (head, payload)


def encode_frame(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """Serialise one frame."""
    return b"".join(frame_writes(header, payload))


def decode_prefix(prefix: bytes, *, max_header: int, max_payload: int) -> tuple[int, int]:
    """Return (header length, payload length), refusing sizes over the limits."""
    if len(prefix) != PREFIX.size:
        raise ProtocolError("short frame prefix")
    header_len, payload_len = PREFIX.unpack(prefix)
    if not 2 <= header_len <= max_header:
        raise ProtocolError(f"header length {header_len} out of bounds")
    if payload_len > max_payload:
        raise ProtocolError(f"payload length {payload_len} exceeds {max_payload}")
    return header_len, payload_len


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"non-standard JSON constant {name}")


def decode_header(raw: bytes) -> dict[str, Any]:
    """Parse a frame header, which must be a JSON object."""
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"malformed header: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("header is not a JSON object")
    return obj


# -- the generic codec: a message's header fields are its dataclass fields -------------------

M = TypeVar("M", bound="Message")
R = TypeVar("R", bound="Message")
_Check = Callable[[str, Any], Any]
OMIT_DEFAULT = {"omit_default": True}
"""Field metadata: left out of the header while it has its default (fields defaulting to None
are always left out while None)."""


def _exact(kind: type, shown: str) -> _Check:
    def check(name: str, value: Any) -> Any:
        if type(value) is not kind:
            raise BadMessage(f"field {name!r} must be {shown}")
        return value

    return check


def _optional(inner: _Check) -> _Check:
    return lambda name, value: None if value is None else inner(name, value)


def _count(name: str, value: Any) -> int:
    if type(value) is not int:
        raise BadMessage(f"field {name!r} must be int")
    if value < 0:
        raise BadMessage(f"field {name!r} must not be negative")
    return value


def _number(name: str, value: Any) -> float:
    if type(value) not in (int, float):
        raise BadMessage(f"field {name!r} must be a number")
    return float(value)


def _names(name: str, value: Any) -> tuple[str, ...]:
    if type(value) not in (list, tuple) or not all(type(item) is str for item in value):
        raise BadMessage(f"field {name!r} must be a list of str")
    return tuple(value)


_CHECKS: dict[str, _Check] = {
    "str": _exact(str, "str"),
    "int": _exact(int, "int"),
    "bool": _exact(bool, "bool"),
    "Count": _count,
    "float": _number,
    "Env": _exact(dict, "dict"),
    "str | None": _optional(_exact(str, "str")),
    "int | None": _optional(_exact(int, "int")),
    "float | None": _optional(_number),
    "tuple[str, ...]": _names,
}
"""Annotation (as written: annotations stay strings, which keeps the agent running on Python 3.9)
to its check."""


@dataclass(frozen=True)
class _Field:
    name: str
    check: _Check
    default: Any  # dataclasses.MISSING: required
    omit_default: bool


_SPECS: dict[type, tuple[tuple[_Field, ...], str | None]] = {}


def _spec(cls: type) -> tuple[tuple[_Field, ...], str | None]:
    """(header fields, the payload field's name) of a message class, worked out once."""
    known = _SPECS.get(cls)
    if known is not None:
        return known
    header: list[_Field] = []
    payload: str | None = None
    for f in dataclasses.fields(cls):
        annotation = str(f.type)
        if annotation == "bytes":
            payload = f.name
            continue
        if annotation not in _CHECKS:
            raise TypeError(f"{cls.__name__}.{f.name}: no wire check for {annotation!r}")
        default = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        omit = bool(f.metadata.get("omit_default")) or default is None
        header.append(_Field(f.name, _CHECKS[annotation], default, omit))
    _SPECS[cls] = (tuple(header), payload)
    return _SPECS[cls]


@dataclass(frozen=True)
class Message:
    """A request or a reply: header fields are the dataclass fields; a ``bytes`` field is the payload."""

    def encode(self) -> tuple[dict[str, Any], bytes]:
        """The header fields (without ``id`` and ``op``/``type``) and the payload."""
        fields, payload = _spec(type(self))
        header: dict[str, Any] = {}
        for f in fields:
            value = getattr(self, f.name)
            if not (f.omit_default and value == f.default):
                header[f.name] = value
        return header, getattr(self, payload) if payload else b""

    @classmethod
    def decode(cls: type[M], header: Mapping[str, Any], payload: bytes = b"") -> M:
        """The message in a frame, every field checked.

        Raises:
            BadMessage: a field is missing or of the wrong type, or the message breaks its rules.
        """
        fields, payload_field = _spec(cls)
        values: dict[str, Any] = {}
        for f in fields:
            if f.name in header:
                values[f.name] = f.check(f.name, header[f.name])
            elif f.default is not dataclasses.MISSING:
                values[f.name] = f.default
            else:
                f.check(f.name, None)  # the message of a missing field is that of a wrong one
        if payload_field:
            values[payload_field] = payload
        message = cls(**values)
        message.check()
        return message

    def check(self) -> None:
        """Rules beyond the fields' types; raises ``BadMessage``."""


@dataclass(frozen=True)
class Reply(Message):
    """A response frame's ``type`` is ``result`` unless a reply says otherwise."""

    TYPE: ClassVar[str] = "result"


@dataclass(frozen=True)
class Done(Reply):
    """A result with nothing to say (write, append, delete, an upload chunk, tar_end)."""


@dataclass(frozen=True)
class Request(Message, Generic[R]):
    """A request names its op and the reply that ends it."""

    OP: ClassVar[str]
    REPLY: ClassVar[type[Message]]

    def __init_subclass__(cls, op: str = "", reply: type[Message] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if op and reply is not None:
            cls.OP, cls.REPLY = op, reply

    def decode_reply(self, header: Mapping[str, Any], payload: bytes = b"") -> R:
        """This request's ``result`` frame, checked against the request too.

        Raises:
            BadMessage: the reply breaks the schema or asks more than was asked.
        """
        reply = self.REPLY.decode(header, payload)
        self.check_reply(reply)
        return cast(R, reply)

    def check_reply(self, reply: Any) -> None:
        """Rules of the reply that depend on the request (a size asked for); ``BadMessage``."""


def take(header: Mapping[str, Any], key: str, annotation: str, default: Any = None) -> Any:
    """``header[key]`` (or ``default``) checked as a field annotated ``annotation`` would be."""
    return _CHECKS[annotation](key, header.get(key, default))
