"""Strict parsing of what the agent sends back: everything from the sandbox is untrusted input.

Each function raises ``ProtocolError`` on anything unexpected; the channel then breaks rather
than guess. Nothing here trusts a length, a type or a path the agent chose.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping
from typing import Any, Literal

from dispatcher.core.errors import ToolPermissionDenied, WorkspaceEscapeError
from dispatcher.core.sandbox_api import DirEntry, DirListing, EntryKind, FileOpError, FileStat, SandboxError
from dispatcher.sandbox.agent.agent import CHUNK, ProtocolError

MAX_MESSAGE = 1000  # characters of an agent error message passed on
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_KINDS: frozenset[str] = frozenset({"file", "dir", "symlink", "other"})
_AGENT_FAULTS = frozenset({"bad_request", "internal", "protocol"})  # the agent blames the host


def _text(value: str) -> str:
    """Lone surrogates (legal in JSON escapes) replaced, so the text can be encoded downstream."""
    return value.encode("utf-8", "replace").decode("utf-8")


def require(header: Mapping[str, Any], key: str, kind: type) -> Any:
    """``header[key]`` if it is exactly of ``kind`` (so ``True`` is not an int)."""
    value = header.get(key)
    if type(value) is not kind:
        raise ProtocolError(f"field {key!r} is not {kind.__name__}")
    return value


def _optional_int(header: Mapping[str, Any], key: str) -> int | None:
    value = header.get(key)
    if value is not None and type(value) is not int:
        raise ProtocolError(f"field {key!r} is not an int")
    return value


def check_error(header: Mapping[str, Any]) -> None:
    """An ``error`` frame has a slug code and a string message."""
    code = require(header, "code", str)
    require(header, "message", str)
    if not _CODE.fullmatch(code):
        raise ProtocolError("malformed error code")


def error_for(header: Mapping[str, Any]) -> Exception:
    """The exception a checked ``error`` frame stands for."""
    code: str = header["code"]
    message = _text(header["message"][:MAX_MESSAGE])
    if code == "escape":
        return WorkspaceEscapeError(message)
    if code == "denied":
        return ToolPermissionDenied(message)
    if code in _AGENT_FAULTS:
        return SandboxError(f"agent refused the request ({code}): {message}")
    return FileOpError(code, message)


def relative_path(reply: Mapping[str, Any]) -> str:
    """A ``resolve`` result: a normalised relative path inside the workspace ('.' for the root)."""
    rel: str = require(reply, "path", str)
    bad = not rel or posixpath.isabs(rel) or "\x00" in rel or posixpath.normpath(rel) != rel
    if bad or rel.split("/")[0] == "..":
        raise ProtocolError("resolved path is not a normalised relative path inside the workspace")
    # Exact: a name's undecodable bytes stay lone surrogates, so the path can be handed back as
    # the approved one; whoever shows it escapes them (``visible``).
    return rel


def check_exit(header: Mapping[str, Any]) -> None:
    """An ``exit`` frame has exactly one of an exit status (0-255) or a signal number."""
    exit_code = _optional_int(header, "exit_code")
    sig = _optional_int(header, "signal")
    if (exit_code is None) == (sig is None):
        raise ProtocolError("exit frame needs exactly one of exit_code or signal")
    if exit_code is not None and not 0 <= exit_code <= 255:
        raise ProtocolError("exit status out of range")
    if sig is not None and not 0 < sig < 128:
        raise ProtocolError("signal number out of range")


def output_stream(header: Mapping[str, Any], payload: bytes) -> Literal["stdout", "stderr"]:
    """The stream of an ``output`` frame whose chunk is within bounds."""
    stream = header.get("stream")
    if not 0 < len(payload) <= CHUNK:
        raise ProtocolError("output chunk size out of bounds")
    if stream == "stdout":
        return "stdout"
    if stream == "stderr":
        return "stderr"
    raise ProtocolError("output frame with an unknown stream")


def stat_result(reply: Mapping[str, Any], root: str) -> FileStat:
    """A ``stat`` result, its path placed under ``root`` only if it stays there."""
    rel = require(reply, "path", str)
    kind = require(reply, "kind", str)
    size = require(reply, "size", int)
    mode = require(reply, "mode", int)
    mtime = reply.get("mtime")
    if kind not in _KINDS or size < 0 or mode < 0:
        raise ProtocolError("malformed stat result")
    if not isinstance(mtime, int | float) or isinstance(mtime, bool):
        raise ProtocolError("field 'mtime' is not a number")
    if posixpath.isabs(rel) or ".." in rel.split("/") or "\x00" in rel:
        raise ProtocolError("stat path is not a relative path inside the workspace")
    full = root if rel == "." else posixpath.join(root, _text(rel))
    return FileStat(path=full, kind=kind, size=size, mode=mode, mtime=float(mtime))


def listing(reply: Mapping[str, Any], body: bytes, limit: int) -> DirListing:
    """A ``list`` result: a JSON array of at most ``limit`` entries in the payload."""
    truncated = require(reply, "truncated", bool)
    try:
        raw = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError("listing is not JSON") from None
    if not isinstance(raw, list) or len(raw) > limit:
        raise ProtocolError("listing is not an array within the limit")
    return DirListing(entries=tuple(_dir_entry(item) for item in raw), truncated=truncated)


def _dir_entry(item: Any) -> DirEntry:
    if not isinstance(item, dict):
        raise ProtocolError("listing entry is not an object")
    name = require(item, "name", str)
    kind: EntryKind = require(item, "kind", str)
    size = require(item, "size", int)
    target = item.get("target")
    if not name or "/" in name or "\x00" in name or name in (".", "..") or kind not in _KINDS or size < 0:
        raise ProtocolError("malformed listing entry")
    if target is not None and type(target) is not str:
        raise ProtocolError("malformed symlink target")
    # Names and targets keep the lone surrogates of bytes that were not UTF-8 (os.fsdecode's
    # convention) so that list_dir can show them escaped and unambiguously; the core makes any
    # text it returns encodable, so a tool that passes one on unescaped cannot break a stream.
    return DirEntry(name=name, kind=kind, size=size, target=target)
