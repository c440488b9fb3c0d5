"""The agent protocol's one schema: a frozen dataclass per request and reply, with its validation.

Both ends import this module: the agent (inside the sandbox, stdlib only) and the host
(``dispatcher.sandbox.agent_link``), which imports it alone (with ``codec.py``, whose frame codec
it re-exports), without the rest of the agent. A change to an op's shape is one edit here;
``PROTOCOL_VERSION`` changes with it.

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
the error codes. Some concepts' messages live in modules of their own: foreground commands'
(``exec_messages.py``), the egress tunnel's (``tunnel_messages.py``, a listener's many frames) and
the process table's (``process_messages.py``); all are re-exported here: this module stays the one
the host imports.

Decoding checks every field's exact type (``True`` is not an int) and each message's own rules;
a message that breaks them raises ``BadMessage``: the agent answers ``bad_request``, the host
breaks the link (everything the agent sends is untrusted). Encoding trusts its caller.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from .codec import CHUNK as CHUNK
from .codec import OMIT_DEFAULT, Count, check_relative, take
from .codec import PREFIX as PREFIX
from .codec import BadMessage as BadMessage
from .codec import Done as Done
from .codec import Message as Message
from .codec import ProtocolError as ProtocolError
from .codec import Reply as Reply
from .codec import Request as Request
from .codec import decode_header as decode_header
from .codec import decode_prefix as decode_prefix
from .codec import encode_frame as encode_frame
from .codec import frame_writes as frame_writes
from .exec_messages import MAX_STATE as MAX_STATE
from .exec_messages import SIGNALS as SIGNALS
from .exec_messages import Delivered as Delivered
from .exec_messages import Exec as Exec
from .exec_messages import Exit as Exit
from .exec_messages import Output as Output
from .exec_messages import SendSignal as SendSignal
from .identity import parse_grants as parse_grants
from .identity import waiting_socket_name as waiting_socket_name
from .process_messages import MAX_READ as MAX_READ
from .process_messages import PROCESS_REQUESTS
from .process_messages import ProcChunk as ProcChunk
from .process_messages import ProcData as ProcData
from .process_messages import ProcInfo as ProcInfo
from .process_messages import ProcInput as ProcInput
from .process_messages import ProcList as ProcList
from .process_messages import ProcListRequest as ProcListRequest
from .process_messages import ProcOutput as ProcOutput
from .process_messages import ProcRead as ProcRead
from .process_messages import ProcSignal as ProcSignal
from .process_messages import ProcStart as ProcStart
from .process_messages import ProcUnwatch as ProcUnwatch
from .process_messages import ProcWatch as ProcWatch
from .tunnel_messages import HOST_WINDOW as HOST_WINDOW
from .tunnel_messages import MAX_CONNECTS as MAX_CONNECTS
from .tunnel_messages import MAX_TUNNELS as MAX_TUNNELS
from .tunnel_messages import SANDBOX_WINDOW as SANDBOX_WINDOW
from .tunnel_messages import TUNNEL_CHUNK as TUNNEL_CHUNK
from .tunnel_messages import TUNNEL_PORT as TUNNEL_PORT
from .tunnel_messages import Listening as Listening
from .tunnel_messages import TunnelClose as TunnelClose
from .tunnel_messages import TunnelClosed as TunnelClosed
from .tunnel_messages import TunnelConnect as TunnelConnect
from .tunnel_messages import TunnelCredit as TunnelCredit
from .tunnel_messages import TunnelData as TunnelData
from .tunnel_messages import TunnelEof as TunnelEof
from .tunnel_messages import TunnelListen as TunnelListen
from .tunnel_messages import TunnelOpened as TunnelOpened
from .tunnel_messages import TunnelSend as TunnelSend
from .tunnel_messages import TunnelShut as TunnelShut
from .tunnel_messages import TunnelWindow as TunnelWindow

CONNECT_FAILED = 3
"""The agent's exit status when ``--connect`` cannot reach the server's socket (the server then
attaches an agent through the daemon instead)."""
PROTOCOL_VERSION = 9
"""Bumped whenever an op or a field changes; the server refuses an agent of another version.
9: ``tunnel_connect`` (the host connects to a port of the sandbox's loopback) and ``tunnel_shut``.
8: the process table (``process_messages.py``); exec's ``leave_as`` and ``capture_state``, and
its exit's ``left``, ``cwd``, ``env`` and ``unset``.
7: tunnel frames carry up to ``TUNNEL_CHUNK`` (256 KiB) and the window differs by direction.
6: ``pause`` (stop and continue what commands started, where the sandbox cannot be frozen).
5: the egress tunnel ops (``tunnel_listen`` and the frames of its connections).
3: file ops take ``approved`` and exec ``approved_cwd`` (a path used exactly, never through a link),
and ``resolve`` answers the path itself (undecodable bytes as lone surrogates, not U+FFFD).
``python3 agent.pyz --version`` prints ``dispatcher-agent protocol N`` (the start-up image check)."""
MAX_HEADER = 1 << 20  # the largest request header the agent reads
MAX_PAYLOAD = 64 << 20  # the largest request payload the agent reads
KINDS = frozenset({"file", "dir", "symlink", "other"})
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


# -- replies -------------------------------------------------------------------------------------


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
        check_relative(self.path, "stat path")


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
        truncated = take(header, "truncated", "bool")
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
class ProcsResult(Reply):
    processes: Count
    killed: Count
    left: Count


@dataclass(frozen=True)
class Paused(Reply):
    processes: Count
    """How many processes the request stopped (or continued)."""


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
class Procs(Request[ProcsResult], op="procs", reply=ProcsResult):
    """Count what commands left running; ``kill`` stops and kills it all. ``spare_exec_sessions``:
    leave out the sessions the server attached itself (sandboxed MCP servers)."""

    kill: bool = False
    spare_exec_sessions: bool = field(default=False, metadata=OMIT_DEFAULT)


@dataclass(frozen=True)
class Pause(Request[Paused], op="pause", reply=Paused):
    """``paused``: stop (``SIGSTOP``) every process the sandbox's commands started, again until no
    new one appears; else continue (``SIGCONT``) exactly those earlier pauses stopped (one stopped
    by anything else stays so). For a paused session whose sandbox cannot be frozen (a Pod)."""

    paused: bool


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
        Ping, Read, Write, Append, Exists, Stat, ListDir, Delete, Resolve, Exec, SendSignal,
        Procs, Pause, UntarBegin, UntarChunk, UntarEnd, TarBegin, TarRead, TarEnd,
        TunnelListen, TunnelSend, TunnelClose, TunnelCredit, TunnelConnect, TunnelShut,
        *PROCESS_REQUESTS,
    )
}  # fmt: skip
"""Every op, by its name on the wire."""
_APPROVED = sorted(
    op for op, cls in REQUESTS.items() if "approved" in {f.name for f in dataclasses.fields(cls)}
)


class Send(Protocol):
    """Writes one response frame (the agent's side); False once nobody reads them any more."""

    def __call__(self, rid: int | None, reply: Reply, /) -> bool: ...


def request_writes(rid: int, request: Request[Any]) -> tuple[bytes, ...]:
    """The frame of a request (the host's side), as the writes that send it (``frame_writes``)."""
    fields, payload = request.encode()
    return frame_writes({"id": rid, "op": request.OP, **fields}, payload)


def encode_request(rid: int, request: Request[Any]) -> bytes:
    """The frame of a request (the host's side)."""
    return b"".join(request_writes(rid, request))


def reply_writes(rid: int | None, reply: Reply) -> tuple[bytes, ...]:
    """The frame of a response (the agent's side), as the writes that send it."""
    fields, payload = reply.encode()
    return frame_writes({"id": rid, "type": reply.TYPE, **fields}, payload)


def encode_reply(rid: int | None, reply: Reply) -> bytes:
    """The frame of a response (the agent's side)."""
    return b"".join(reply_writes(rid, reply))


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


def handover_identity(root: str, grants: list[tuple[str, str]] | None) -> dict[str, Any]:
    """What a waiting agent compares before it takes a channel: the protocol version, its root and
    its grants, as they travel (JSON)."""
    loaded: dict[str, Any] = json.loads(
        json.dumps({"version": PROTOCOL_VERSION, "root": root, "grants": grants})
    )
    return loaded
