"""The agent protocol's one schema: the frame codec and a frozen dataclass per request and reply.

Both ends import this module: the agent (inside the sandbox, stdlib only) and the host
(``dispatcher.sandbox.agent_link``), which imports it alone, without the rest of the agent. A
change to an op's shape is one edit here; ``PROTOCOL_VERSION`` changes with it.

Frame: ``>II`` prefix (header length, payload length), a JSON object (ASCII), the raw payload.
Requests carry ``id`` (int) and ``op``; every response carries the request's ``id`` and a
``type``: ``result`` or ``error`` (``code``, ``message``) end a request, and ``exec`` answers
with any number of ``output`` frames (``stream``, payload = bytes) followed by one ``exit``.

Each op is one ``Request`` subclass below (its fields are the header's, a ``bytes`` field is the
payload) and names the ``Reply`` that ends it; ``REQUESTS`` lists them by op. ``approved`` (and
exec's ``approved_cwd``): the path ``resolve`` gave when a human approved the call, used exactly
(see ``workspace.py``). ``expect_sha256`` (review mode): what the file must still be just before
it is replaced. Trees: ``untar_begin`` (then ``untar_chunk`` per piece of a tar archive, then
``untar_end``) and ``tar_begin`` (then ``tar_read`` per chunk, then ``tar_end``). ``Error`` lists
the error codes.

Decoding checks every field's exact type (``True`` is not an int) and each message's own rules;
a message that breaks them raises ``BadMessage``: the agent answers ``bad_request``, the host
breaks the link (everything the agent sends is untrusted). Encoding trusts its caller.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, NoReturn, Protocol, TypeVar, cast

PROTOCOL_VERSION = 4
"""Bumped whenever an op or a field changes; the server refuses an agent of another version.
3: file ops take ``approved`` and exec ``approved_cwd`` (a path used exactly, never through a link),
and ``resolve`` answers the path itself (undecodable bytes as lone surrogates, not U+FFFD).
``python3 agent.pyz --version`` prints ``dispatcher-agent protocol N`` (the start-up image check)."""
PREFIX = struct.Struct(">II")
MAX_HEADER = 1 << 20  # the largest request header the agent reads
MAX_PAYLOAD = 64 << 20  # the largest request payload the agent reads
CHUNK = 64 * 1024  # largest output frame
KINDS = frozenset({"file", "dir", "symlink", "other"})
SIGNALS = ("TERM", "KILL", "INT")
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")

Count = int
"""An int that must not be negative (a size, a limit, a number of things)."""
Env = dict[str, str]
"""Environment variables: a JSON object of str to str (names without ``=`` or NUL)."""


class ProtocolError(Exception):
    """A frame broke the protocol; the stream cannot be trusted any more."""


class BadMessage(ProtocolError):
    """A well-framed message whose fields break the schema (on the agent: a ``bad_request``)."""


def encode_frame(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """Serialise one frame."""
    # ASCII escapes keep any str encodable, lone surrogates from odd file names included.
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode("ascii")
    return PREFIX.pack(len(raw), len(payload)) + raw + payload


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


_CHECKS: dict[str, _Check] = {
    "str": _exact(str, "str"),
    "int": _exact(int, "int"),
    "bool": _exact(bool, "bool"),
    "Count": _count,
    "float": _number,
    "Env": _exact(dict, "dict"),
    "str | None": _optional(_exact(str, "str")),
    "int | None": _optional(_exact(int, "int")),
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


def _relative(path: str, what: str) -> None:
    if posixpath.isabs(path) or ".." in path.split("/") or "\x00" in path:
        raise BadMessage(f"{what} is not a relative path inside the workspace")


# -- replies -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Done(Reply):
    """A result with nothing to say (write, append, patch, delete, an upload chunk, tar_end)."""


@dataclass(frozen=True)
class Error(Reply):
    """A request failed. Codes: errno names (``ENOENT``, ``EISDIR``, ...), ``too_large``,
    ``no_match``, ``changed``, ``multiple_matches``, ``refused`` (an archive member that may not be
    extracted), ``conflict``, ``bad_archive``, ``escape`` (resolves outside the root), ``denied``
    (outside the fs grants), ``proc_limit`` (no process or thread for a command: the pids limit is
    full; ``processes`` counts what earlier commands left running), and ``bad_request``,
    ``internal``, ``protocol`` (the host's fault or the agent's; ``id: null`` answers an
    unparseable frame)."""

    TYPE: ClassVar[str] = "error"
    code: str
    message: str
    processes: int | None = None

    def check(self) -> None:
        if not _CODE.fullmatch(self.code):
            raise BadMessage("malformed error code")
        if self.code == "proc_limit" and self.processes is None:
            raise BadMessage("field 'processes' must be int")


@dataclass(frozen=True)
class Pong(Reply):
    version: int


@dataclass(frozen=True)
class ReadResult(Reply):
    size: Count
    data: bytes


@dataclass(frozen=True)
class ExistsResult(Reply):
    exists: bool


@dataclass(frozen=True)
class StatResult(Reply):
    path: str  # relative to the root; '.' for the root itself
    kind: str
    size: Count
    mode: Count
    mtime: float

    def check(self) -> None:
        if self.kind not in KINDS:
            raise BadMessage("malformed stat result")
        _relative(self.path, "stat path")


@dataclass(frozen=True)
class ListEntry(Message):
    name: str  # undecodable bytes as lone surrogates (JSON-escaped): names never look alike
    kind: str
    size: Count
    target: str | None = None  # a symlink's

    def check(self) -> None:
        name = self.name
        if not name or "/" in name or "\x00" in name or name in (".", "..") or self.kind not in KINDS:
            raise BadMessage("malformed listing entry")


@dataclass(frozen=True)
class ListResult(Reply):
    """The entries travel as a JSON array in the payload."""

    truncated: bool
    entries: tuple[ListEntry, ...]

    def encode(self) -> tuple[dict[str, Any], bytes]:
        # ASCII: lone surrogates survive.
        body = json.dumps([entry.encode()[0] for entry in self.entries]).encode("ascii")
        return {"truncated": self.truncated}, body

    @classmethod
    def decode(cls, header: Mapping[str, Any], payload: bytes = b"") -> ListResult:
        truncated = _CHECKS["bool"]("truncated", header.get("truncated"))
        try:
            raw = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise BadMessage("listing is not JSON") from None
        if not isinstance(raw, list):
            raise BadMessage("listing is not an array")
        if not all(isinstance(item, dict) for item in raw):
            raise BadMessage("listing entry is not an object")
        return cls(truncated, tuple(ListEntry.decode(item) for item in raw))


@dataclass(frozen=True)
class ResolveResult(Reply):
    path: str  # exact: a name's undecodable bytes stay lone surrogates, to be handed back

    def check(self) -> None:
        rel = self.path
        bad = not rel or posixpath.isabs(rel) or "\x00" in rel or posixpath.normpath(rel) != rel
        if bad or rel.split("/")[0] == "..":
            raise BadMessage("resolved path is not a normalised relative path inside the workspace")


@dataclass(frozen=True)
class Output(Reply):
    TYPE: ClassVar[str] = "output"
    stream: str
    data: bytes

    def check(self) -> None:
        if not 0 < len(self.data) <= CHUNK:
            raise BadMessage("output chunk size out of bounds")
        if self.stream not in ("stdout", "stderr"):
            raise BadMessage("output frame with an unknown stream")


@dataclass(frozen=True)
class Exit(Reply):
    """Exactly one of an exit status (0-255) or the number of the signal that ended the command."""

    TYPE: ClassVar[str] = "exit"
    exit_code: int | None
    signal: int | None

    def check(self) -> None:
        if (self.exit_code is None) == (self.signal is None):
            raise BadMessage("exit frame needs exactly one of exit_code or signal")
        if self.exit_code is not None and not 0 <= self.exit_code <= 255:
            raise BadMessage("exit status out of range")
        if self.signal is not None and not 0 < self.signal < 128:
            raise BadMessage("signal number out of range")


@dataclass(frozen=True)
class Delivered(Reply):
    delivered: bool


@dataclass(frozen=True)
class ProcsResult(Reply):
    processes: Count
    killed: Count
    left: Count


@dataclass(frozen=True)
class UploadStarted(Reply):
    upload: int


@dataclass(frozen=True)
class UntarResult(Reply):
    files: Count
    directories: Count
    bytes: Count


@dataclass(frozen=True)
class DownloadStarted(Reply):
    download: int


@dataclass(frozen=True)
class TarChunk(Reply):
    eof: bool
    data: bytes = b""


# -- requests ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ping(Request[Pong], op="ping", reply=Pong):
    """Answers the protocol version (checked on every connect)."""


@dataclass(frozen=True)
class Read(Request[ReadResult], op="read", reply=ReadResult):
    """At most ``max_bytes``; with ``strict``, ``too_large`` if the file is bigger."""

    path: str
    max_bytes: Count
    strict: bool
    approved: str | None = None

    def check_reply(self, reply: Any) -> None:
        if len(reply.data) > self.max_bytes:
            raise BadMessage("read returned more than was asked")


@dataclass(frozen=True)
class Write(Request[Done], op="write", reply=Done):
    """Replace the file atomically with ``data``."""

    path: str
    data: bytes
    approved: str | None = None
    expect_sha256: str | None = None


@dataclass(frozen=True)
class Append(Request[Done], op="append", reply=Done):
    """Append ``data`` to the file, creating it and its parents."""

    path: str
    data: bytes


@dataclass(frozen=True)
class Patch(Request[Done], op="patch", reply=Done):
    """Replace the single occurrence of ``old`` with ``new``: the payload is both, ``old_len`` splits it."""

    path: str
    old: bytes
    new: bytes
    approved: str | None = None
    expect_sha256: str | None = None

    def encode(self) -> tuple[dict[str, Any], bytes]:
        header: dict[str, Any] = {"path": self.path, "old_len": len(self.old)}
        for key in ("approved", "expect_sha256"):
            if getattr(self, key) is not None:
                header[key] = getattr(self, key)
        return header, self.old + self.new

    @classmethod
    def decode(cls, header: Mapping[str, Any], payload: bytes = b"") -> Patch:
        path = _CHECKS["str"]("path", header.get("path"))
        split = _CHECKS["int"]("old_len", header.get("old_len"))
        approved = _CHECKS["str | None"]("approved", header.get("approved"))
        expect = _CHECKS["str | None"]("expect_sha256", header.get("expect_sha256"))
        if not 0 <= split <= len(payload):
            raise BadMessage("old_len out of range")
        return cls(path, payload[:split], payload[split:], approved, expect)


@dataclass(frozen=True)
class Exists(Request[ExistsResult], op="exists", reply=ExistsResult):
    """Whether the path exists (inside the workspace)."""

    path: str


@dataclass(frozen=True)
class Stat(Request[StatResult], op="stat", reply=StatResult):
    """Kind, size, mode and mtime; links followed (inside the workspace)."""

    path: str
    approved: str | None = None


@dataclass(frozen=True)
class ListDir(Request[ListResult], op="list", reply=ListResult):
    """Up to ``limit`` entries sorted by name."""

    path: str
    limit: Count
    approved: str | None = None

    def check_reply(self, reply: Any) -> None:
        if len(reply.entries) > self.limit:
            raise BadMessage("listing is not an array within the limit")


@dataclass(frozen=True)
class Delete(Request[Done], op="delete", reply=Done):
    """Remove a file, a symbolic link (not its target) or an empty directory."""

    path: str


@dataclass(frozen=True)
class Resolve(Request[ResolveResult], op="resolve", reply=ResolveResult):
    """The real path, relative to the root, exactly (see ``ResolveResult``)."""

    path: str


@dataclass(frozen=True)
class Exec(Request[Exit], op="exec", reply=Exit):
    """``sh -c command``; its output frames come before the ``exit`` that ends it."""

    command: str
    cwd: str = "."
    env: Env = field(default_factory=dict)
    stdin: bytes | None = None  # travels as the payload, announced by the header's bool
    approved_cwd: str | None = None

    def encode(self) -> tuple[dict[str, Any], bytes]:
        header: dict[str, Any] = {
            "command": self.command,
            "cwd": self.cwd,
            "env": dict(self.env),
            "stdin": self.stdin is not None,
        }
        if self.approved_cwd is not None:
            header["approved_cwd"] = self.approved_cwd
        return header, self.stdin or b""

    @classmethod
    def decode(cls, header: Mapping[str, Any], payload: bytes = b"") -> Exec:
        command = _CHECKS["str"]("command", header.get("command"))
        cwd = _CHECKS["str"]("cwd", header.get("cwd", "."))
        approved_cwd = _CHECKS["str | None"]("approved_cwd", header.get("approved_cwd"))
        env = _CHECKS["Env"]("env", header.get("env", {}))
        use_stdin = _CHECKS["bool"]("stdin", header.get("stdin", False))
        message = cls(command, cwd, env, payload if use_stdin else None, approved_cwd)
        message.check()
        return message

    def check(self) -> None:
        for key, value in self.env.items():
            if not key or "=" in key or "\x00" in key or type(value) is not str or "\x00" in value:
                raise BadMessage(f"bad environment variable {key!r}")


@dataclass(frozen=True)
class SendSignal(Request[Delivered], op="signal", reply=Delivered):
    """Signal a running command's process group (``TERM``, ``KILL`` or ``INT``)."""

    exec_id: int
    signal: str

    def check(self) -> None:
        if self.signal not in SIGNALS:
            raise BadMessage(f"unknown signal {self.signal!r}")


@dataclass(frozen=True)
class Procs(Request[ProcsResult], op="procs", reply=ProcsResult):
    """Count what commands left running; ``kill`` stops and kills it all. ``spare_exec_sessions``:
    leave out the sessions the server attached itself (sandboxed MCP servers)."""

    kill: bool = False
    spare_exec_sessions: bool = field(default=False, metadata=OMIT_DEFAULT)


@dataclass(frozen=True)
class UntarBegin(Request[UploadStarted], op="untar_begin", reply=UploadStarted):
    """Start an upload: a tar stream unpacked into directory ``path`` (made if missing)."""

    path: str
    max_files: Count
    max_bytes: Count


@dataclass(frozen=True)
class UntarChunk(Request[Done], op="untar_chunk", reply=Done):
    """The next bytes of an upload's archive; answered once the extractor took them."""

    upload: int
    data: bytes


@dataclass(frozen=True)
class UntarEnd(Request[UntarResult], op="untar_end", reply=UntarResult):
    """Move the files into place (``commit``) or drop them."""

    upload: int
    commit: bool


@dataclass(frozen=True)
class TarBegin(Request[DownloadStarted], op="tar_begin", reply=DownloadStarted):
    """Start a download: a tar of ``path`` (a file or a directory)."""

    path: str
    max_bytes: Count


@dataclass(frozen=True)
class TarRead(Request[TarChunk], op="tar_read", reply=TarChunk):
    """The next chunk of a download's archive."""

    download: int


@dataclass(frozen=True)
class TarEnd(Request[Done], op="tar_end", reply=Done):
    """Stop a download."""

    download: int


REQUESTS: dict[str, type[Request[Any]]] = {
    cls.OP: cls
    for cls in (
        Ping, Read, Write, Append, Patch, Exists, Stat, ListDir, Delete, Resolve, Exec, SendSignal,
        Procs, UntarBegin, UntarChunk, UntarEnd, TarBegin, TarRead, TarEnd,
    )
}  # fmt: skip
"""Every op, by its name on the wire."""
_APPROVED = sorted(
    op for op, cls in REQUESTS.items() if "approved" in {f.name for f in dataclasses.fields(cls)}
)


class Send(Protocol):
    """Writes one response frame (the agent's side); False once nobody reads them any more."""

    def __call__(self, rid: int | None, reply: Reply, /) -> bool: ...


def encode_request(rid: int, request: Request[Any]) -> bytes:
    """The frame of a request (the host's side)."""
    fields, payload = request.encode()
    return encode_frame({"id": rid, "op": request.OP, **fields}, payload)


def encode_reply(rid: int | None, reply: Reply) -> bytes:
    """The frame of a response (the agent's side)."""
    fields, payload = reply.encode()
    return encode_frame({"id": rid, "type": reply.TYPE, **fields}, payload)


def request_id(header: Mapping[str, Any]) -> int | None:
    """A request's id; None when it has none an answer could carry."""
    rid = header.get("id")
    return rid if type(rid) is int else None


def decode_request(header: Mapping[str, Any], payload: bytes) -> Request[Any]:
    """The request in a frame (the agent's side).

    Raises:
        BadMessage: an unknown op, or a field that breaks the op's schema.
    """
    op = header.get("op")
    cls = REQUESTS.get(op) if type(op) is str else None
    if cls is None:
        raise BadMessage(f"unknown op {op!r}")
    if header.get("approved") is not None and op not in _APPROVED:
        raise BadMessage(f"field 'approved' is a str, for {_APPROVED}")
    return cls.decode(header, payload)


def response_head(header: Mapping[str, Any]) -> tuple[int, str]:
    """(id, type) of a response frame (the host's side).

    Raises:
        ProtocolError: no type, no integer id, or an error about a frame the agent could not
            read (the host's frames are broken: the link cannot go on).
    """
    kind = header.get("type")
    if type(kind) is not str:
        raise BadMessage("field 'type' is not str")
    rid = header.get("id")
    if kind == "error" and rid is None:
        error = Error.decode(header)
        raise ProtocolError(f"agent rejected a frame: {error.message[:1000]}")
    if type(rid) is not int:
        raise ProtocolError("response without an integer id")
    return rid, kind
