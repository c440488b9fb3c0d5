#!/usr/bin/env python3
"""In-sandbox agent: runs commands and workspace file operations for the dispatcher.

Run as ``python3 agent.py --root /workspace``. Requests arrive on stdin, responses leave on
stdout, diagnostics go to stderr. Stdlib only and a single file, because it is copied into
sandbox images as is; the host imports the frame codec from here so both ends share it.

Frame: ``>II`` prefix (header length, payload length), a JSON object (ASCII), the raw payload.
Requests carry ``id`` (int) and ``op``; every response carries the request's ``id`` and a
``type``: ``result`` or ``error`` (``code``, ``message``) end a request, and ``exec`` answers
with any number of ``output`` frames (``stream``, payload = bytes) followed by one ``exit``.

====== ================================================ ==========================================
op     request fields (payload)                         result fields (payload)
====== ================================================ ==========================================
ping   -                                                version
read   path, max_bytes, strict                          size (the bytes read)
write  path (the new content)                           -
append path (the bytes to append)                       -
patch  path, old_len (old bytes + new bytes)            -
exists path                                             exists
stat   path                                             path (relative), kind, size, mode, mtime
list   path, limit                                      truncated (JSON array of name/kind/size/target)
delete path                                             -
resolve path                                            path (real path, relative to the root, exact)
exec   command, cwd, env, stdin, approved_cwd (stdin)   output* then exit: exit_code | signal
signal exec_id, signal (TERM | KILL | INT)              delivered
procs  kill (bool)                                      processes, killed, left
====== ================================================ ==========================================

``approved`` (read, write, patch, stat, list; ``approved_cwd`` for exec): the path ``resolve`` gave
when a human approved the call. The op then uses exactly it, walked from the root one component at
a time without following any link, and fails with ``changed`` (nothing done) if a link, or a
directory moved meanwhile, stands on it: what a human approves is what runs.

A command starts with the agent's own environment (``docker exec`` gives it the container's
configured one: the image's ``ENV``), minus names starting ``DISPATCHER_AGENT_``, plus ``env``; in
``cwd`` (relative to the root, confined like every path).

Trees (UploadFiles / DownloadFiles): ``untar_begin`` {path, max_files, max_bytes} answers
``upload`` (an id); each ``untar_chunk`` {upload} carries the next bytes of a tar archive and is
answered once the extractor took it; ``untar_end`` {upload, commit} answers files, directories,
bytes. ``tar_begin`` {path, max_bytes} answers ``download``; each ``tar_read`` {download} answers
``eof`` with the next chunk of the archive as payload; ``tar_end`` {download} stops it.

Error codes: errno names (``ENOENT``, ``EISDIR``, ...), ``too_large``, ``no_match``, ``changed``,
``multiple_matches``, ``refused`` (an archive member that may not be extracted), ``conflict``,
``bad_archive``, ``escape`` (resolves outside the root), ``denied`` (outside the fs grants),
``proc_limit`` (no process or thread for a command: the pids limit is full; ``processes`` counts
the processes earlier commands left running), and ``bad_request``, ``internal``, ``protocol`` (the host's fault or the agent's). ``id: null``
errors answer unparseable frames.

With ``--grants '[{"path": "src", "mode": "rw"}, {"path": "pub", "mode": "r"}]'`` every file
operation (and a command's working directory) is refused with ``denied`` unless a grant covers the
place it actually opened, checked on the opened descriptor through ``/proc/self/fd``: a symlink
swapped in after the host's check cannot carry an operation outside its grant.

Processes: commands run on threads started with the agent (a full pids limit cannot starve it).
Background processes outlive their command. ``procs`` counts what commands left running, and with
``kill`` stops and kills all of it (a fork bomb included): every process but the agent and those
that ran before it (init, the container's keep-alive process); an agent running as root kills
nothing, since it is not in a sandbox.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import itertools
import json
import os
import queue
import secrets
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import IO, Any, NoReturn

PROTOCOL_VERSION = 4
"""Bumped whenever an op or a field changes; the server refuses an agent of another version.
3: file ops take ``approved`` and exec ``approved_cwd`` (a path used exactly, never through a link),
and ``resolve`` answers the path itself (undecodable bytes as lone surrogates, not U+FFFD).
`agent.py --version` prints ``dispatcher-agent protocol N`` (the start-up image check)."""
PREFIX = struct.Struct(">II")
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 64 << 20
CHUNK = 64 * 1024  # largest output frame
COALESCE_SECONDS = 0.01  # small writes wait this long for company before being sent
DRAIN_SECONDS = 0.2  # after sh exits, how long background children may keep the pipes busy
LIST_SCAN_CAP = 100_000  # names read from one directory before giving up on a full sort
MAX_DEPTH = 1024  # directory levels below the root that a write may walk or create
MAX_SYMLINKS = 40  # links followed while resolving one path, as the kernel allows (then ELOOP)
FILE_WORKERS, FILE_WORKERS_MAX = 4, 8  # threads for file ops: started at once, at most
EXEC_WORKERS, EXEC_WORKERS_MAX = 4, 32  # threads for commands (the host runs 4 at once per session)
KILL_STRAYS_SECONDS = 3.0  # how long `procs` with kill keeps stopping and killing a fork bomb
_SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT}


class ProtocolError(Exception):
    """A frame broke the protocol; the stream cannot be trusted any more."""


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


class OpError(Exception):
    """A request failed in an ordinary way; becomes an ``error`` response."""

    def __init__(self, code: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = fields
        """Extra fields of the error frame (``proc_limit`` carries ``processes``)."""


def _field(header: Mapping[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    value = header.get(key, default)
    if value is ... or type(value) is not kind:
        raise OpError("bad_request", f"field {key!r} must be {kind.__name__}")
    return value


def _expected(header: Mapping[str, Any]) -> str | None:
    """``expect_sha256`` of a write or patch (review mode): what the file must still be."""
    value = header.get("expect_sha256")
    if value is not None and type(value) is not str:
        raise OpError("bad_request", "field 'expect_sha256' must be str")
    return value


def _count(header: Mapping[str, Any], key: str) -> int:
    value: int = _field(header, key, int)
    if value < 0:
        raise OpError("bad_request", f"field {key!r} must not be negative")
    return value


def _clean(name: str) -> str:
    """Make a file name from the disk JSON-safe (undecodable bytes become U+FFFD)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _realpath(path: str) -> str:
    """``os.path.realpath`` (non-strict) without recursion: a chain of links cannot exhaust the stack.

    At most ``MAX_SYMLINKS`` links are followed, like the kernel; more is ``ELOOP``.
    """
    pending = path.split("/")[::-1]  # components still to walk, the next one last
    resolved = ""  # "" is "/"
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = resolved.rpartition("/")[0]
            continue
        candidate = f"{resolved}/{name}"
        try:
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:
            is_link = False  # missing (or unreadable): kept as written, like realpath(strict=False)
        if not is_link:
            resolved = candidate
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise OpError("ELOOP", f"more than {MAX_SYMLINKS} symbolic links in the path")
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = ""
        pending.extend(target.split("/")[::-1])
    return resolved or "/"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _os_error(exc: OSError, shown: str) -> OpError:
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    # strerror only: the filename in the exception is a real path, which must not leak.
    return OpError(code, f"{shown}: {exc.strerror or code}")


class Workspace:
    """File operations confined to one root, with symlinks resolved here, where the files are."""

    def __init__(self, root: str, grants: list[tuple[str, str]] | None = None) -> None:
        self.root = os.path.realpath(root)
        self.grants = grants
        """(prefix relative to the root, "r" | "rw"); None: the whole root read-write."""
        mask = os.umask(0)
        os.umask(mask)
        self._new_mode = 0o666 & ~mask
        self.dir_mode = 0o777 & ~mask
        """What a directory made without a mode of its own gets (the umask applied)."""
        self._locks = [threading.Lock() for _ in range(64)]  # striped: one read-modify-write at a time

    def resolve(self, path: str) -> str:
        """Real absolute path of ``path``; refuses NUL and anything resolving outside the root."""
        if "\x00" in path:
            raise OpError("escape", f"{path!r}: path contains a NUL byte")
        joined = path if os.path.isabs(path) else os.path.join(self.root, path)
        real = _realpath(joined)
        if not _inside(real, self.root):
            raise OpError("escape", f"{path}: path escapes the workspace")
        return real

    def relative(self, real: str) -> str:
        """Path under the root as the host should see it ('.' for the root itself)."""
        return _clean(os.path.relpath(real, self.root))

    def _open_dir(self, real_dir: str, shown: str, mode: str = "r", leaf: str | None = None) -> int:
        fd = os.open(real_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._verify_fd(fd, shown, mode, leaf)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _verify_fd(self, fd: int, shown: str, mode: str = "r", leaf: str | None = None) -> None:
        """Re-check an opened file's location (``leaf`` inside it, if given) against the root and
        the grants, closing the window a symlink swap could use."""
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return  # no /proc: the realpath checks stand alone
        if where.startswith("/") and not where.endswith(" (deleted)"):
            if not _inside(where, self.root):
                raise OpError("escape", f"{shown}: path escapes the workspace")
            self.check_grant(os.path.join(where, leaf) if leaf else where, shown, mode)

    def check_grant(self, real: str, shown: str, mode: str) -> None:
        """Refuse ``real`` (absolute, inside the root) unless a grant covers it for ``mode``.

        Mode ``cwd`` (a command's working directory) also accepts the directories above a grant:
        a shell may start where it can see its grants; what it may touch is the kernel's to enforce.
        """
        if self.grants is None:
            return
        rel = os.path.relpath(real, self.root)
        for prefix, granted in self.grants:
            if mode == "rw" and granted != "rw":
                continue
            if prefix == "." or rel == prefix or rel.startswith(prefix + "/"):
                return
            if mode == "cwd" and (rel == "." or prefix.startswith(rel + "/")):
                return
        verb = "write" if mode == "rw" else "read"
        raise OpError("denied", f"{shown}: not granted for {verb} access")

    def _granted(self, path: str, mode: str) -> str:
        """``resolve`` plus the grant check on the real path (the fd checks repeat it at use)."""
        real = self.resolve(path)
        self.check_grant(real, path, mode)
        return real

    def _locate(self, path: str, approved: str | None = None) -> tuple[str, os.stat_result]:
        """Real path and stat of an existing path, taken from one descriptor checked for reading."""
        if approved is not None:
            return self._locate_approved(path, approved)
        real = self._granted(path, "r")
        fd = os.open(real, os.O_PATH | os.O_CLOEXEC)
        try:
            self._verify_fd(fd, path, "r")
            return real, os.fstat(fd)
        finally:
            os.close(fd)

    def open_cwd(self, path: str, approved: str | None = None) -> tuple[int, str]:
        """A verified descriptor of a command's working directory (see ``check_grant``), and its path."""
        try:
            if approved is not None:
                real = self.approved(approved, path, "cwd")
                return self._make_dirs(real, path, "cwd", None, create=False, pinned="run"), real
            real = self._granted(path, "cwd")
            return self._open_dir(real, path, "cwd"), real
        except NotADirectoryError:
            raise OpError("ENOTDIR", f"{path}: working directory is not a directory") from None
        except FileNotFoundError:
            raise OpError("ENOENT", f"{path}: working directory does not exist") from None

    def _lock(self, real: str) -> threading.Lock:
        return self._locks[hash(real) % len(self._locks)]

    def _open_regular(
        self, real: str, shown: str, flags: int, dir_fd: int | None = None, mode: str = "r"
    ) -> int:
        # O_NONBLOCK keeps a FIFO from hanging the agent; only regular files are accepted anyway.
        fd = os.open(real, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666, dir_fd=dir_fd)
        try:
            st_mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(st_mode):
                raise OpError("EISDIR", f"{shown}: is a directory")
            if not stat.S_ISREG(st_mode):
                raise OpError("EINVAL", f"{shown}: not a regular file")
            self._verify_fd(fd, shown, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, path: str, max_bytes: int, strict: bool, approved: str | None = None) -> tuple[bytes, int]:
        """Return (at most ``max_bytes`` of the file, its size); ``too_large`` if strict and bigger."""
        if approved is None:
            fd = self._open_regular(self._granted(path, "r"), path, os.O_RDONLY)
        else:
            real = self.approved(approved, path, "r")
            dfd, name = self._parent_fd(path, real, "read", "r", create=False)
            try:
                fd = self._open_pinned(dfd, name, path, os.O_RDONLY, "r", "read")
            finally:
                os.close(dfd)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            if strict and size > max_bytes:
                raise OpError("too_large", f"{path}: file is {size} bytes, more than {max_bytes}")
            data = f.read(max_bytes)
        return data, size

    def _parent_fd(
        self, path: str, real: str, pinned: str | None = None, mode: str = "rw", create: bool = True
    ) -> tuple[int, str]:
        if real == self.root:
            raise OpError("EISDIR", f"{path}: is the workspace root")
        parent, name = os.path.split(real)
        return self._make_dirs(parent, path, mode, name, create=create, pinned=pinned), name

    def _make_dirs(
        self,
        real_dir: str,
        shown: str,
        mode: str,
        leaf: str | None,
        *,
        create: bool = True,
        pinned: str | None = None,
    ) -> int:
        """A verified descriptor of ``real_dir`` (inside the root), making missing directories.

        One component at a time from the root through directory descriptors, never recursing (a
        deep path cannot exhaust the stack) and never following a link (one planted after
        ``resolve`` is refused, not followed). ``pinned`` (what the operation does, for the
        message): ``real_dir`` was approved, so a link on the way, or a descriptor that is not
        at ``real_dir``, means the path changed since (``changed``).
        """
        rel = os.path.relpath(real_dir, self.root)
        parts = [] if rel == "." else rel.split("/")
        if len(parts) > MAX_DEPTH:
            # Not the path itself in the message: thousands of characters of a/a/a help nobody.
            raise OpError("ENAMETOOLONG", f"path is {len(parts)} directories deep, more than {MAX_DEPTH}")
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.root, flags)
        try:
            for part in parts:
                try:
                    child = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    with contextlib.suppress(FileExistsError):  # made meanwhile: fine
                        os.mkdir(part, 0o777, dir_fd=fd)
                    child = os.open(part, flags, dir_fd=fd)
                except OSError as exc:
                    if pinned is not None and _is_link(exc, fd, part):
                        raise _changed(shown, pinned) from None
                    raise
                fd, parent_fd = child, fd
                os.close(parent_fd)
            self._verify_fd(fd, shown, mode, leaf)
            if pinned is not None and _moved(fd, real_dir):
                raise _changed(shown, pinned)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, path: str, data: bytes, approved: str | None = None, expect: str | None = None) -> None:
        """Atomically replace the file: temp file in the same directory, fsync, rename. With
        ``expect`` (a sha256, or "absent"), only if the file still is that just before the rename."""
        real = self._granted(path, "rw") if approved is None else self.approved(approved, path, "rw")
        pinned = None if approved is None else "written"
        with self._lock(real):
            dfd, name = self._parent_fd(path, real, pinned)
            try:
                self._replace(dfd, name, data, path, pinned, expect)
            finally:
                os.close(dfd)

    def _replace(
        self,
        dfd: int,
        name: str,
        data: bytes,
        shown: str,
        pinned: str | None = None,
        expect: str | None = None,
    ) -> None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            mode = self._new_mode
        else:
            if stat.S_ISDIR(st.st_mode):
                raise OpError("EISDIR", f"{shown}: is a directory")
            if pinned is not None and stat.S_ISLNK(st.st_mode):
                raise _changed(shown, pinned)  # approved as a file (or nothing), now a link
            mode = stat.S_IMODE(st.st_mode)
        tmp = f".~{secrets.token_hex(6)}.tmp"  # short: a long leaf name plus a suffix could overflow
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
        )
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, mode)
                os.fsync(fd)  # data before rename: a crash never exposes a half-written file
            finally:
                os.close(fd)
            if expect is not None and _content_sha256(dfd, name) != expect:
                raise OpError(
                    "changed",
                    f"{shown} changed after the change to it was reviewed; nothing was written. Read the"
                    " file again and repeat the call to have it reviewed again.",
                )
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise

    def append(self, path: str, data: bytes) -> None:
        """Append to the file, creating it (and its parents) if needed."""
        real = self._granted(path, "rw")
        with self._lock(real):
            dfd, name = self._parent_fd(path, real)
            try:
                fd = self._open_regular(
                    name, path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, dir_fd=dfd, mode="rw"
                )
            finally:
                os.close(dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)

    def patch(
        self, path: str, old: bytes, new: bytes, approved: str | None = None, expect: str | None = None
    ) -> None:
        """Replace the single occurrence of ``old``; the file is untouched on any failure."""
        if not old:
            raise OpError("no_match", f"{path}: the text to replace is empty")
        if approved is not None:
            self._patch_approved(path, old, new, approved, expect)
            return
        real = self._granted(path, "rw")
        with self._lock(real):
            data, _ = self.read(path, MAX_PAYLOAD, True)
            patched = _patched(data, old, new, path)
            dfd, name = self._parent_fd(path, real)
            try:
                self._replace(dfd, name, patched, path, None, expect)
            finally:
                os.close(dfd)

    def _patch_approved(self, path: str, old: bytes, new: bytes, approved: str, expect: str | None) -> None:
        """``patch`` of exactly the approved file: read and replaced through one directory descriptor."""
        real = self.approved(approved, path, "rw")
        with self._lock(real):
            dfd, name = self._parent_fd(path, real, "written", create=False)
            try:
                fd = self._open_pinned(dfd, name, path, os.O_RDONLY, "rw", "written")
                with os.fdopen(fd, "rb") as f:
                    size = os.fstat(fd).st_size
                    if size > MAX_PAYLOAD:
                        raise OpError("too_large", f"{path}: file is {size} bytes, more than {MAX_PAYLOAD}")
                    data = f.read(MAX_PAYLOAD)
                self._replace(dfd, name, _patched(data, old, new, path), path, "written", expect)
            finally:
                os.close(dfd)

    def exists(self, path: str) -> bool:
        """True if the resolved path exists."""
        try:
            self._locate(path)
        except OSError:
            return False
        return True

    def stat(self, path: str, approved: str | None = None) -> dict[str, Any]:
        """Kind, size, mode and mtime of the resolved path."""
        real, st = self._locate(path, approved)
        return {
            "path": self.relative(real),
            "kind": _kind(st.st_mode),
            "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode),
            "mtime": st.st_mtime,
        }

    def list(self, path: str, limit: int, approved: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """Up to ``limit`` entries sorted by name, and whether more existed."""
        if approved is None:
            dfd = self._open_dir(self._granted(path, "r"), path)  # listed through the checked fd
        else:
            real = self.approved(approved, path, "r")
            dfd = self._make_dirs(real, path, "r", None, create=False, pinned="listed")
        try:
            names: list[str] = []
            complete = True
            with os.scandir(dfd) as it:
                for entry in it:
                    if len(names) >= LIST_SCAN_CAP:
                        complete = False
                        break
                    names.append(entry.name)
            names.sort()
            entries = []
            for name in names[:limit]:
                try:
                    st = os.lstat(name, dir_fd=dfd)
                except OSError:
                    continue  # vanished while listing
                kind = _kind(st.st_mode)
                # Undecodable bytes stay lone surrogates (JSON-escaped on the wire): the host shows
                # them escaped, so two different names never look the same.
                item: dict[str, Any] = {"name": name, "kind": kind, "size": st.st_size}
                if kind == "symlink":
                    try:
                        item["target"] = os.readlink(name, dir_fd=dfd)
                    except OSError:
                        item["target"] = ""
                entries.append(item)
        finally:
            os.close(dfd)
        return entries, not complete or len(names) > limit

    # -- approved paths: used exactly as a human approved them, never through a link ----------

    def resolve_exact(self, path: str) -> str:
        """``resolve``, relative to the root, with the names as they are (lone surrogates for
        bytes that are not UTF-8): what the host shows for approval and hands back as ``approved``."""
        return os.path.relpath(self.resolve(path), self.root)

    def approved(self, rel: str, shown: str, mode: str) -> str:
        """The absolute path of an approved path (normalised, relative to the root, as
        ``resolve_exact`` gave it), checked against the grants for ``mode``."""
        parts = [] if rel == "." else rel.split("/")
        if not rel or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
            raise OpError("bad_request", "field 'approved' must be a normalised path inside the workspace")
        if len(parts) > MAX_DEPTH:
            raise OpError("ENAMETOOLONG", f"path is {len(parts)} directories deep, more than {MAX_DEPTH}")
        real = os.path.join(self.root, rel) if parts else self.root
        self.check_grant(real, shown, mode)
        return real

    def _open_pinned(self, dfd: int, name: str, shown: str, flags: int, mode: str, pinned: str) -> int:
        """``_open_regular`` of ``name`` in ``dfd``; a link there now means the path changed."""
        try:
            return self._open_regular(name, shown, flags, dir_fd=dfd, mode=mode)
        except OSError as exc:
            if _is_link(exc, dfd, name):
                raise _changed(shown, pinned) from None
            raise

    def _locate_approved(self, path: str, approved: str) -> tuple[str, os.stat_result]:
        real = self.approved(approved, path, "r")
        if real == self.root:
            fd = self._make_dirs(real, path, "r", None, create=False, pinned="read")
            try:
                return real, os.fstat(fd)
            finally:
                os.close(fd)
        dfd, name = self._parent_fd(path, real, "read", "r", create=False)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        finally:
            os.close(dfd)
        if stat.S_ISLNK(st.st_mode):
            raise _changed(path, "read")
        return real, st

    def delete(self, path: str) -> None:
        """Remove a file, a symlink (not its target) or an empty directory."""
        if "\x00" in path:
            raise OpError("escape", f"{path!r}: path contains a NUL byte")
        joined = (path if os.path.isabs(path) else os.path.join(self.root, path)).rstrip("/")
        head, name = os.path.split(joined)
        if name in ("", ".", ".."):
            raise OpError("EINVAL", f"{path}: refusing to delete this path")
        parent = _realpath(head or "/")
        if not _inside(parent, self.root):
            raise OpError("escape", f"{path}: path escapes the workspace")
        self.check_grant(os.path.join(parent, name), path, "rw")
        dfd = self._open_dir(parent, path, "rw", name)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.rmdir(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)
        finally:
            os.close(dfd)


def _content_sha256(dfd: int, name: str) -> str:
    """sha256 hex of the regular file ``name`` in ``dfd`` as it is now; "absent" when there is none
    (anything else there, a link included, hashes as nothing a review could have seen)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "unreadable"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "not a file"
        if st.st_size > MAX_PAYLOAD:
            return "too large"  # never what a review showed (it reads at most 8 MiB): not read
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def _patched(data: bytes, old: bytes, new: bytes, shown: str) -> bytes:
    count = data.count(old)  # UTF-8 is self-synchronising, so byte matches are char matches
    if count == 0:
        raise OpError("no_match", f"{shown}: the text to replace was not found")
    if count > 1:
        raise OpError("multiple_matches", f"{shown}: the text to replace occurs {count} times")
    return data.replace(old, new, 1)


def _changed(shown: str, done: str) -> OpError:
    return OpError(
        "changed",
        f"{shown}: the path changed after it was approved (a symbolic link or another directory "
        f"now stands where the approved one was); nothing was {done}",
    )


def _is_link(exc: OSError, dfd: int, name: str) -> bool:
    """Whether an open of ``name`` in ``dfd`` failed because it is a symbolic link now."""
    if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return False
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _moved(fd: int, expected: str) -> bool:
    """Whether the directory ``fd`` holds is no longer at ``expected`` (renamed while walked)."""
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False  # no /proc: the link-free walk stands alone
    return where.startswith("/") and where != expected


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class _Exec:
    """A running command, addressable by the request id that started it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pgid: int | None = None
        self.early: list[int] = []  # signals that arrived before the process existed
        self.signalled = False
        self.finished = False

    def signal(self, sig: int) -> bool:
        with self.lock:
            self.signalled = True
            if self.finished:
                return False
            if self.pgid is None:
                self.early.append(sig)
                return True
            return _killpg(self.pgid, sig)


_Job = tuple[Any, tuple[Any, ...]]


class _Workers:
    """Threads started ahead of need, so that serving a request never depends on making one.

    A thread takes a pid like a process does: once a command's leftovers have filled the pids
    limit, ``threading.Thread.start`` fails, but these threads are already running. More are
    started on demand up to ``limit`` while pids allow.
    """

    def __init__(self, name: str, started: int, limit: int) -> None:
        self._name = name
        self._limit = limit
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job | None]] = []
        self._backlog: deque[_Job] = deque()
        self._count = 0
        for _ in range(started):
            self._start(None)

    def _start(self, job: _Job | None) -> bool:
        """A new worker, given ``job`` or made idle; False when the limit or the pids forbid."""
        inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        if job is not None:
            inbox.put(job)
        with self._lock:
            if self._count >= self._limit:
                return False
            self._count += 1
        thread = threading.Thread(
            target=self._work, args=(inbox,), name=f"{self._name}-{self._count}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": no pid left
            with self._lock:
                self._count -= 1
            return False
        if job is None:
            with self._lock:
                self._idle.append(inbox)
        return True

    def _work(self, inbox: queue.SimpleQueue[_Job | None]) -> None:
        job = inbox.get()
        while job is not None:
            fn, args = job
            try:
                fn(*args)
            except BaseException as exc:  # handlers answer their own errors; never lose the worker
                print(f"agent: {self._name} worker: {exc!r}", file=sys.stderr)
            with self._lock:
                if self._backlog:
                    job = self._backlog.popleft()
                    continue
                self._idle.append(inbox)
            job = inbox.get()

    def try_submit(self, fn: Any, *args: Any) -> bool:
        """Run ``fn(*args)`` on an idle worker or a new one; False when there is neither."""
        with self._lock:
            if self._idle:
                self._idle.pop().put((fn, args))
                return True
        return self._start((fn, args))

    def submit(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on a worker, queued until one is free when none can be started."""
        if self.try_submit(fn, *args):
            return
        with self._lock:
            if self._idle:
                self._idle.pop().put((fn, args))
            else:
                self._backlog.append((fn, args))

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        """Drop queued jobs and let idle workers end (busy ones end with their job)."""
        with self._lock:
            self._backlog.clear()
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # the name in parentheses may hold anything
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (IndexError, ValueError):
        return None


KEEPALIVE_CMDLINE = b"sleep\x002147483647\x00"
"""The container's own command (see the sandbox provider): it keeps the container up."""


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(64)
    except OSError:
        return b""


def _ppid(pid: int) -> int | None:
    return _parent_and_session(pid)[0]


def _parent_and_session(pid: int) -> tuple[int | None, int | None]:
    """(parent pid, session id) from ``/proc/<pid>/stat``, in one read; Nones once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rfind(b")") + 2 :].split()  # after the name: state, ppid, pgrp, session
        return int(fields[1]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None, None


def _outside_exec_sessions(found: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """``found`` less the sessions ``docker exec`` started: their leader has no parent in the
    container (parent pid 0), as a process the server attached on its own does (a sandboxed MCP
    server). Nothing a command starts can have parent 0: it descends from the agent."""
    ids = {pid: _parent_and_session(pid) for pid, _, _ in found}
    leaders = {pid for pid, (ppid, session) in ids.items() if ppid == 0 and session == pid}
    return [p for p in found if ids[p[0]][1] not in leaders] if leaders else found


def _container_own(found: list[tuple[int, str, int]]) -> set[tuple[int, int]] | None:
    """(pid, start) of the container's own processes: init and the keep-alive it started first,
    or the keep-alive as pid 1; None when this is not a sandbox container."""
    starts = {pid: start for pid, _, start in found}
    if 1 not in starts:
        return None
    if _cmdline(1) == KEEPALIVE_CMDLINE:
        return {(1, starts[1])}
    # Nothing a command starts can come before the keep-alive, so no command can pass for it.
    others = sorted((start, pid) for pid, start in starts.items() if pid != 1)
    if others:
        start, pid = others[0]
        if _ppid(pid) == 1 and _cmdline(pid) == KEEPALIVE_CMDLINE:
            return {(1, starts[1]), (pid, start)}
    return None


class _Strays:
    """The processes that the sandbox's commands started, found through ``/proc``.

    Everything but the agent and the container's own processes: init (pid 1) and the keep-alive
    process it started first. Processes an earlier agent's commands left running count too (a
    restarted server starts a new agent in the same container). Each process is known by pid and
    start time, so a recycled pid is never taken for another process: not for one of those
    spared, not for one about to be signalled.
    """

    def __init__(self) -> None:
        self._own = os.getpid()
        found = self._scan()
        own = _container_own(found)
        self.in_container = own is not None
        """In a sandbox container (not the local backend, which runs the agent on the host)."""
        # Outside a sandbox container: everything that ran before is spared.
        self._before = own or {(pid, start) for pid, _, start in found}

    def _scan(self) -> list[tuple[int, str, int]]:
        try:
            names = os.listdir("/proc")
        except OSError:
            return []
        found = []
        for name in names:
            if name.isdigit() and int(name) != self._own:
                info = _proc_stat(int(name))
                if info is not None:
                    found.append((int(name), info[0], info[1]))
        return found

    def list(self) -> list[tuple[int, str, int]]:
        """(pid, state, start time) of each stray, zombies included (they hold a pid too)."""
        return [p for p in self._scan() if (p[0], p[2]) not in self._before]

    def kill_all(self, deadline: float) -> int:
        """Stop, then kill, every stray until none is left or ``deadline``; returns how many.

        A fork bomb forks again while it is being killed: stopping everything first leaves
        nothing that can fork, then the kills, then a new round for what slipped through.
        """
        killed: set[tuple[int, int]] = set()
        while time.monotonic() < deadline:
            live = [(pid, start) for pid, state, start in self.list() if state not in "ZX"]
            if not live:
                break
            for pid, start in live:
                _signal_process(pid, start, signal.SIGSTOP)
            for pid, start in live:
                if _signal_process(pid, start, signal.SIGKILL):
                    killed.add((pid, start))
        # The dead keep their pids until init reaps them; a command started before that fails.
        while self.list() and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(killed)


def _signal_process(pid: int, start: int, sig: int) -> bool:
    """Signal the process ``pid`` only if it is still the one that started at ``start``."""
    fd: int | None = None
    try:
        fd = os.pidfd_open(pid)  # pins the process: the check below cannot go stale
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):
        fd = None  # no pidfd (old kernel, gVisor): the start time check still narrows the race
    try:
        info = _proc_stat(pid)
        if info is None or info[1] != start:
            return False
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


class Agent:
    """Reads requests, runs each on a worker thread, writes responses under one lock."""

    def __init__(self, root: str, out: IO[bytes], grants: list[tuple[str, str]] | None = None) -> None:
        self.ws = Workspace(root, grants)
        self._out = out
        self._out_lock = threading.Lock()
        self._execs: dict[int, _Exec] = {}
        self._execs_lock = threading.Lock()
        self._lingering: set[int] = set()  # groups of finished commands that left children running
        # Started now, while pids are free: a request is never refused for want of a thread.
        self._pool = _Workers("file-op", FILE_WORKERS, FILE_WORKERS_MAX)
        self._exec_pool = _Workers("exec", EXEC_WORKERS, EXEC_WORKERS_MAX)
        self._strays = _Strays()
        self.transfers = _Transfers(self)  # uploads and downloads (tar streams) in progress
        self._env = command_env(os.environ)

    def send(self, header: Mapping[str, Any], payload: bytes = b"") -> bool:
        """Write one frame; blocks while the host is slow, which back-pressures commands."""
        frame = encode_frame(header, payload)
        with self._out_lock:
            try:
                self._out.write(frame)
                self._out.flush()
            except (OSError, ValueError):
                return False
        return True

    def serve(self, inp: IO[bytes]) -> int:
        """Handle requests until stdin closes; returns the exit status."""
        clean_eof = False
        try:
            while True:
                prefix = inp.read(PREFIX.size)
                if not prefix:
                    clean_eof = True
                    return 0
                try:
                    header_len, payload_len = decode_prefix(
                        prefix, max_header=MAX_HEADER, max_payload=MAX_PAYLOAD
                    )
                except ProtocolError as exc:
                    self.send({"id": None, "type": "error", "code": "protocol", "message": str(exc)})
                    return 2  # lengths are garbage, so the stream cannot be resynchronised
                raw = inp.read(header_len)
                payload = inp.read(payload_len) if payload_len else b""
                if len(raw) != header_len or len(payload) != payload_len:
                    return 2
                try:
                    header = decode_header(raw)
                except ProtocolError as exc:
                    self.send({"id": None, "type": "error", "code": "protocol", "message": str(exc)})
                    continue
                try:
                    self.dispatch(header, payload)
                except Exception as exc:  # e.g. no thread could start: this request fails, not the agent
                    rid = header.get("id")
                    print(f"agent: request {rid!r} could not start: {exc!r}", file=sys.stderr)
                    rid = rid if type(rid) is int else None
                    self.send({"id": rid, "type": "error", "code": "internal", "message": type(exc).__name__})
        finally:
            # In a container, the container bounds what is left; on a host, nothing may outlive us.
            self.shutdown(keep_background=clean_eof and self._strays.in_container)

    def shutdown(self, keep_background: bool = False) -> None:
        """Kill every running command (its answer has nowhere to go).

        ``keep_background``: spare what finished commands left running in the background
        (``cmd &``). So it is on a clean end of stdin in a sandbox container: the server went away
        (restarted) and a new agent will take over the container, or the server is removing the
        container anyway.
        """
        with self._execs_lock:
            running = list(self._execs.values())
            lingering = [] if keep_background else list(self._lingering)
        for ex in running:
            ex.signal(signal.SIGKILL)
        for pgid in lingering:
            _killpg(pgid, signal.SIGKILL)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def dispatch(self, header: dict[str, Any], payload: bytes) -> None:
        """Route one request; never raises."""
        rid = header.get("id")
        if type(rid) is not int:
            self.send({"id": None, "type": "error", "code": "bad_request", "message": "missing id"})
            return
        op = header.get("op")
        if op == "ping":
            self.send({"id": rid, "type": "result", "version": PROTOCOL_VERSION})
        elif op == "signal":
            self._guarded(rid, self._signal, header)
        elif op == "exec":
            if not self._exec_pool.try_submit(self._guarded, rid, self._exec, header, payload):
                self._guarded(rid, self._no_process)
        elif op == "procs":
            self._pool.submit(self._guarded, rid, self._procs, header)
        elif op in _FILE_OPS:
            self._pool.submit(self._guarded, rid, self._file_op, header, payload)
        elif op in _TRANSFER_OPS:
            self._guarded(rid, self.transfers.handle, header, payload)
        else:
            self.send({"id": rid, "type": "error", "code": "bad_request", "message": f"unknown op {op!r}"})

    def _guarded(self, rid: int, handler: Any, *args: Any) -> None:
        try:
            handler(rid, *args)
        except OpError as exc:
            self.send({"id": rid, "type": "error", "code": exc.code, "message": exc.message, **exc.fields})
        except Exception as exc:
            print(f"agent: request {rid} failed: {exc!r}", file=sys.stderr)
            self.send({"id": rid, "type": "error", "code": "internal", "message": type(exc).__name__})

    def _signal(self, rid: int, header: Mapping[str, Any]) -> None:
        target = _field(header, "exec_id", int)
        name = _field(header, "signal", str)
        if name not in _SIGNALS:
            raise OpError("bad_request", f"unknown signal {name!r}")
        with self._execs_lock:
            ex = self._execs.get(target)
        delivered = ex.signal(_SIGNALS[name]) if ex is not None else False
        self.send({"id": rid, "type": "result", "delivered": delivered})

    def _file_op(self, rid: int, header: Mapping[str, Any], payload: bytes) -> None:
        op = header["op"]
        path = _field(header, "path", str)
        approved = header.get("approved")  # the real path a human approved: used exactly
        if approved is not None and (type(approved) is not str or op not in _APPROVED_OPS):
            raise OpError("bad_request", f"field 'approved' is a str, for {sorted(_APPROVED_OPS)}")
        ws = self.ws
        result: dict[str, Any] = {}
        body = b""
        try:
            if op == "read":
                body, result["size"] = ws.read(
                    path, _count(header, "max_bytes"), _field(header, "strict", bool), approved
                )
            elif op == "write":
                ws.write(path, payload, approved, _expected(header))
            elif op == "append":
                ws.append(path, payload)
            elif op == "patch":
                split = _field(header, "old_len", int)
                if not 0 <= split <= len(payload):
                    raise OpError("bad_request", "old_len out of range")
                ws.patch(path, payload[:split], payload[split:], approved, _expected(header))
            elif op == "exists":
                result["exists"] = ws.exists(path)
            elif op == "stat":
                result.update(ws.stat(path, approved))
            elif op == "list":
                entries, result["truncated"] = ws.list(path, _count(header, "limit"), approved)
                body = json.dumps(entries).encode("ascii")  # ASCII: lone surrogates survive
            elif op == "delete":
                ws.delete(path)
            elif op == "resolve":
                result["path"] = ws.resolve_exact(path)
        except OSError as exc:
            raise _os_error(exc, path) from None
        self.send({"id": rid, "type": "result", **result}, body)

    def _exec(self, rid: int, header: Mapping[str, Any], payload: bytes) -> None:
        command = _field(header, "command", str)
        cwd_arg = _field(header, "cwd", str, ".")
        approved_cwd = header.get("approved_cwd")
        if approved_cwd is not None and type(approved_cwd) is not str:
            raise OpError("bad_request", "field 'approved_cwd' must be str")
        env_arg = _field(header, "env", dict, {})
        use_stdin = _field(header, "stdin", bool, False)
        env = dict(self._env)
        for key, value in env_arg.items():
            if not key or "=" in key or "\x00" in key or type(value) is not str or "\x00" in value:
                raise OpError("bad_request", f"bad environment variable {key!r}")
            env[key] = value
        if "\x00" in command:
            raise OpError("bad_request", "command contains a NUL byte")
        try:
            cwd_fd, cwd = self.ws.open_cwd(cwd_arg, approved_cwd)
        except OSError as exc:
            raise _os_error(exc, cwd_arg) from None
        try:
            ex = _Exec()
            with self._execs_lock:
                if rid in self._execs:
                    raise OpError("bad_request", f"exec id {rid} is in use")
                self._execs[rid] = ex
            try:
                # The child changes into the checked descriptor, not a name that could be swapped.
                fd_path = f"/proc/self/fd/{cwd_fd}"
                if os.path.isdir(fd_path):
                    cwd = fd_path
                elif approved_cwd is not None:  # the name could be swapped: no approved start by it
                    raise OpError(
                        "ENOTSUP", f"{cwd_arg}: no /proc to start a command in an approved directory"
                    )
                self._run(rid, ex, command, cwd, env, payload if use_stdin else None)
            finally:
                with self._execs_lock:
                    self._execs.pop(rid, None)
        finally:
            os.close(cwd_fd)

    def _run(
        self, rid: int, ex: _Exec, command: str, cwd: str, env: dict[str, str], stdin: bytes | None
    ) -> None:
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so signals reach every child
                close_fds=True,
            )
        except BlockingIOError:  # EAGAIN from fork: the pids limit is full
            self._no_process(rid)
        except OSError as exc:
            raise _os_error(exc, "/bin/sh") from None
        with ex.lock:
            ex.pgid = proc.pid
            for sig in ex.early:
                _killpg(proc.pid, sig)
        if stdin is not None and not self._exec_pool.try_submit(_feed, proc.stdin, stdin):
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            self._no_process(rid)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            self._pump(rid, proc)
        finally:
            proc.stdout.close()
            proc.stderr.close()
            code = proc.wait()
            with ex.lock:
                ex.finished = True
                if ex.signalled:  # a killed command leaves no stragglers in its group
                    _killpg(proc.pid, signal.SIGKILL)
                elif _killpg(proc.pid, 0):
                    self._remember_group(proc.pid)
        self.send(
            {
                "id": rid,
                "type": "exit",
                "exit_code": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
            }
        )

    def _no_process(self, rid: int) -> NoReturn:
        """Refuse a command that could not get a process (or a thread) from the pids limit."""
        count = len(self._strays.list())
        raise OpError(
            "proc_limit",
            f"cannot start a process: the sandbox's process limit is exhausted ({count} processes"
            " left running by earlier commands)",
            processes=count,
        )

    def _procs(self, rid: int, header: Mapping[str, Any]) -> None:
        """Count the processes commands left behind; with ``kill``, stop and kill all of them."""
        kill = _field(header, "kill", bool, False)
        found = self._strays.list()
        if _field(header, "spare_exec_sessions", bool, False):  # asking whether commands still work
            found = _outside_exec_sessions(found)
        result = {"processes": sum(1 for _, state, _ in found if state not in "ZX"), "killed": 0}
        if kill:
            if os.geteuid() == 0:  # not in a sandbox (sandboxes never run as root): touch nothing
                raise OpError("bad_request", "the agent runs as root; it kills no processes")
            result["killed"] = self._strays.kill_all(time.monotonic() + KILL_STRAYS_SECONDS)
        result["left"] = len(self._strays.list())
        self.send({"id": rid, "type": "result", **result})

    def _remember_group(self, pgid: int) -> None:
        with self._execs_lock:
            # Forget groups that have emptied since, so neither the set nor a reused id lingers.
            self._lingering = {g for g in self._lingering if _killpg(g, 0)}
            self._lingering.add(pgid)

    def _pump(self, rid: int, proc: subprocess.Popen[bytes]) -> None:
        """Forward output in chunks of at most CHUNK, coalescing small writes briefly.

        One pending buffer for both streams keeps their relative order. The agent only reads
        more after a frame went out, so a slow host back-pressures the command through its pipe.
        """
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        pending = bytearray()
        stream = "stdout"
        since = 0.0
        exited_at: float | None = None

        def flush() -> None:
            if pending and not self.send({"id": rid, "type": "output", "stream": stream}, bytes(pending)):
                _killpg(proc.pid, signal.SIGKILL)  # nobody is listening any more
            pending.clear()

        with sel:
            while sel.get_map():
                now = time.monotonic()
                wait = 0.05
                if pending:
                    wait = min(wait, since + COALESCE_SECONDS - now)
                if exited_at is not None:
                    if now >= exited_at + DRAIN_SECONDS:
                        break  # background children hold the pipes; stop listening to them
                    wait = min(wait, exited_at + DRAIN_SECONDS - now)
                for key, _ in sel.select(max(wait, 0.0)):
                    if pending and key.data != stream:
                        flush()
                    data = os.read(key.fd, CHUNK - len(pending))
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    if not pending:
                        since = time.monotonic()
                    stream = key.data
                    pending += data
                    if len(pending) >= CHUNK:
                        flush()
                if pending and time.monotonic() >= since + COALESCE_SECONDS:
                    flush()
                if exited_at is None and proc.poll() is not None:
                    exited_at = time.monotonic()
            flush()


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    try:
        pipe.write(data)
    except OSError:
        pass  # the command stopped reading; that is its business
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


_FILE_OPS = frozenset({"read", "write", "append", "patch", "exists", "stat", "list", "delete", "resolve"})
_APPROVED_OPS = frozenset({"read", "write", "patch", "stat", "list"})


# -- trees in and out: tar extract (UploadFiles) and create (DownloadFiles) ---------------------

TAR_CHUNK = 1 << 20  # bytes of archive in one tar_read answer
WALKER_FDS = 512  # directory descriptors one upload keeps open at most (per tree it walks)
STAGE_PREFIX = ".~upload-"  # hidden staging directory of an upload, inside its destination
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Aborted(Exception):
    """The host gave up on a transfer; the worker thread stops quietly."""


def _refuse(member: str, why: str) -> OpError:
    return OpError("refused", f"{member}: {why}")


def _member_path(name: str) -> str:
    """The member's name as a normalised relative path ('' for the destination itself)."""
    if "\x00" in name:
        raise _refuse(_clean(name), "name contains a NUL byte")
    if name.startswith("/"):
        raise _refuse(_clean(name), "absolute name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(_clean(name), "'..' in the name leaves the destination")
    if len(parts) > MAX_DEPTH:
        raise _refuse(_clean(name[:200]), f"more than {MAX_DEPTH} directories deep")
    if parts and parts[0].startswith(STAGE_PREFIX):
        raise _refuse(_clean(name), f"names starting with {STAGE_PREFIX!r} are reserved")
    return "/".join(parts)


class _DirWalker:
    """Directory descriptors below one base descriptor, opened one component at a time without
    following links (O_NOFOLLOW), made if asked, cached by relative path; ``close`` releases all.

    The cache is emptied when it holds ``WALKER_FDS`` descriptors: a reopen walks again, without
    following links, so an archive of many directories never runs out of descriptors.
    """

    def __init__(self, base_fd: int, what: str, dir_mode: int = 0o777) -> None:
        self._base = base_fd
        self._fds: dict[str, int] = {"": base_fd}
        self._what = what
        self._dir_mode = dir_mode  # for directories it makes (the umask applies)

    def get(self, rel: str, member: str, create: bool) -> int:
        fd = self._fds.get(rel)
        if fd is not None:
            return fd
        parts = rel.split("/")
        prefixes = list(itertools.accumulate(parts, lambda a, b: f"{a}/{b}"))
        start = len(parts) - 1
        while start > 0 and prefixes[start - 1] not in self._fds:
            start -= 1
        fd = self._fds[prefixes[start - 1]] if start else self._base
        if len(self._fds) + len(parts) - start > WALKER_FDS:
            self.reset()
            start, fd = 0, self._base
        for i in range(start, len(parts)):
            fd = self._open(fd, parts[i], prefixes[i], member, create)
            self._fds[prefixes[i]] = fd
        return fd

    def _open(self, parent: int, name: str, rel: str, member: str, create: bool) -> int:
        try:
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, self._dir_mode, dir_fd=parent)
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refuse(
                    member, f"{_clean(rel)} in {self._what} is not a directory (a file or a symlink)"
                ) from None
            raise

    def reset(self) -> None:
        """Close every cached descriptor; the next ``get`` walks again from the base."""
        self.close()
        self._fds = {"": self._base}

    def close(self) -> None:
        """Close every descriptor it opened (not the base)."""
        for rel, fd in self._fds.items():
            if rel:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fds = {}


class _ChunkFeed:
    """File object over an upload's chunks, read by ``tarfile`` on the extractor thread.

    A chunk is acknowledged when taken, so the host (which keeps a small window of unacknowledged
    chunks) never sends much more than the extractor has consumed.
    """

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._queue: queue.SimpleQueue[tuple[int | None, bytes]] = queue.SimpleQueue()
        self._buf = memoryview(b"")
        self._eof = False

    def put(self, rid: int | None, data: bytes) -> None:
        self._queue.put((rid, data))

    def drain(self) -> list[int]:
        """Request ids of chunks still queued (the extractor has stopped)."""
        rids: list[int] = []
        while True:
            try:
                rid, _ = self._queue.get_nowait()
            except queue.Empty:
                return rids
            if rid is not None:
                rids.append(rid)

    def read(self, size: int = -1) -> bytes:
        while not self._buf and not self._eof:
            rid, data = self._queue.get()
            if rid is None:
                self._eof = True
                break
            self._agent.send({"id": rid, "type": "result"})
            self._buf = memoryview(data)
        if size is None or size < 0:
            size = len(self._buf)
        out = bytes(self._buf[:size])
        self._buf = self._buf[size:]
        return out


def _answer_late(agent: Agent, rid: int, error: OpError | None, result: dict[str, Any]) -> None:
    """Answer a transfer request that came after the transfer ended: its error, or ``result``."""
    if error is not None:
        agent.send({"id": rid, "type": "error", "code": error.code, "message": error.message})
    else:
        agent.send({"id": rid, "type": "result", **result})


class _Upload:
    """One UploadFiles: chunks -> a tar stream -> files in a staging directory -> into place.

    Every member is checked before anything is written (name, type, mode bits, limits). Files
    are extracted into a hidden staging directory inside the destination, so a refused member,
    a breached limit or a full disk leaves the workspace as it was. After the whole archive
    passed, the destination is checked (no symlink or file where a directory must be, no
    directory where a file goes) and then each file is renamed into place (atomic per file).
    """

    def __init__(self, agent: Agent, path: str, max_files: int, max_bytes: int) -> None:
        ws = agent.ws
        self.agent = agent
        self.shown = path
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.stopped = False
        self.error: OpError | None = None
        self.feed = _ChunkFeed(agent)
        self.entries: dict[str, tuple[str, int, float]] = {}  # rel -> (kind, mode, mtime)
        self.files = self.bytes = 0
        real = ws._granted(path or ".", "rw")
        # Directories made for this upload's destination go again if it fails (when still empty).
        self.made: list[str] = []  # deepest first
        missing = real
        while missing != ws.root and not os.path.lexists(missing):
            self.made.append(missing)
            missing = os.path.dirname(missing)
        try:
            self.dest_fd = ws._make_dirs(real, path or ".", "rw", "")
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OpError("ENOTDIR", f"{path}: not a directory") from None
            raise
        try:
            self.stage = f"{STAGE_PREFIX}{secrets.token_hex(6)}"
            os.mkdir(self.stage, 0o700, dir_fd=self.dest_fd)
            self.stage_fd = os.open(self.stage, _DIR_FLAGS, dir_fd=self.dest_fd)
        except BaseException:
            os.close(self.dest_fd)
            raise
        self.thread = threading.Thread(target=self._run, daemon=True, name="untar")
        self.thread.start()

    # -- the extractor thread ------------------------------------------------------------------

    def chunk(self, rid: int, data: bytes) -> None:
        with self.lock:
            if not self.stopped:
                self.feed.put(rid, data)
                return
        self._answer_late(rid)

    def _answer_late(self, rid: int) -> None:
        # Past the end of the archive: ignored.
        _answer_late(self.agent, rid, self.error, {})

    def _run(self) -> None:
        member = "(archive)"
        try:
            staged = _DirWalker(self.stage_fd, "the upload", 0o700)
            try:
                with tarfile.open(fileobj=self.feed, mode="r|") as tar:  # type: ignore[call-overload]
                    for info in tar:
                        member = _clean(info.name)
                        self._extract(tar, info, member, staged)
            finally:
                staged.close()
        except OpError as exc:
            self.error = exc
        except tarfile.TarError as exc:
            self.error = OpError("bad_archive", f"not a valid tar archive at {member}: {exc}")
        except OSError as exc:
            self.error = _os_error(exc, member)
        except _Aborted:
            self.error = OpError("aborted", "the upload was abandoned")
        except Exception as exc:
            print(f"agent: upload failed: {exc!r}", file=sys.stderr)
            self.error = OpError("internal", type(exc).__name__)
        finally:
            with self.lock:
                self.stopped = True
            for rid in self.feed.drain():
                self._answer_late(rid)
            self.finished.set()

    def _extract(self, tar: tarfile.TarFile, info: tarfile.TarInfo, member: str, staged: _DirWalker) -> None:
        rel = _member_path(info.name)
        if info.issym():
            raise _refuse(member, "is a symbolic link (uploads carry files and directories only)")
        if info.islnk():
            raise _refuse(member, "is a hard link (uploads carry files and directories only)")
        if info.ischr() or info.isblk():
            raise _refuse(member, "is a device node")
        if info.isfifo():
            raise _refuse(member, "is a fifo")
        if info.issparse():
            raise _refuse(member, "is a sparse file")
        if not (info.isreg() or info.isdir()):
            raise _refuse(member, f"has an unsupported type {info.type!r}")
        if info.mode & stat.S_ISUID:
            raise _refuse(member, "has the setuid bit")
        if info.mode & stat.S_ISGID:
            raise _refuse(member, "has the setgid bit")
        if len(self.entries) >= self.max_files and rel not in self.entries:
            raise OpError("too_large", f"{member}: more than {self.max_files} entries (max_upload_files)")
        mode = stat.S_IMODE(info.mode) & 0o777
        if info.isdir():
            if rel:
                staged.get(rel, member, create=True)
            self.entries[rel] = ("dir", mode, float(info.mtime))
            return
        if not rel:
            raise _refuse(member, "a file cannot replace the destination directory")
        if self.bytes + info.size > self.max_bytes:
            raise OpError("too_large", f"{member}: the files pass {self.max_bytes} bytes (max_upload_bytes)")
        previous = self.entries.get(rel)
        if previous is not None and previous[0] == "dir":
            raise _refuse(member, "a file with the name of a directory earlier in the archive")
        head, _, name = rel.rpartition("/")
        pfd = staged.get(head, member, create=True)
        if previous is not None:  # the same name twice in one archive: the last one wins
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=pfd)
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd
        )
        try:
            src = tar.extractfile(info)
            assert src is not None
            left = info.size
            while left:
                data = src.read(min(left, CHUNK))
                if not data:
                    raise OpError("bad_archive", f"{member}: the archive ends inside this file")
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                left -= len(data)
            os.fchmod(fd, mode)
            os.utime(fd, (info.mtime, info.mtime))
        finally:
            os.close(fd)
        self.bytes += info.size
        if previous is None:
            self.files += 1
        self.entries[rel] = ("file", mode, float(info.mtime))

    # -- the end ---------------------------------------------------------------------------------

    def end(self, commit: bool) -> dict[str, Any]:
        """Wait for the extractor; then move the files into place (``commit``) or drop them."""
        self.feed.put(None, b"")  # end of the archive
        self.finished.wait()
        try:
            if self.error is not None:
                raise self.error
            if not commit:
                raise OpError("aborted", "the upload was abandoned")
            self._commit()
            self.made = []
            return {
                "files": self.files,
                "directories": sum(1 for k, _, _ in self.entries.values() if k == "dir"),
                "bytes": self.bytes,
            }
        finally:
            self._cleanup()

    def _commit(self) -> None:
        dest = _DirWalker(self.dest_fd, "the workspace")
        staged = _DirWalker(self.stage_fd, "the upload")
        try:
            kinds = self._check_destination(dest)
            moved = self._move_new_trees(kinds, staged, dest)
            dirs = sorted(
                (rel for rel, (kind, _, _) in self.entries.items() if kind == "dir"),
                key=lambda r: r.count("/"),
            )
            for rel in dirs:
                dest.get(rel, rel, create=True)
            for rel, (kind, _, _) in self.entries.items():
                if kind == "file" and rel.partition("/")[0] not in moved:
                    head, _, name = rel.rpartition("/")
                    src_dir = staged.get(head, rel, create=False)
                    os.replace(name, name, src_dir_fd=src_dir, dst_dir_fd=dest.get(head, rel, create=True))
            for rel in reversed(dirs):  # deepest first: filling a directory changes its mtime
                if rel:  # the destination itself keeps its mode
                    _, mode, mtime = self.entries[rel]
                    fd = dest.get(rel, rel, create=False)
                    os.fchmod(fd, mode)
                    os.utime(fd, (mtime, mtime))
        finally:
            dest.close()
            staged.close()

    def _move_new_trees(self, kinds: Mapping[str, str], staged: _DirWalker, dest: _DirWalker) -> set[str]:
        """Move each staged top-level directory the workspace has nothing of in one rename, not
        file by file; returns their names. A name that appeared meanwhile is left to the per-file
        moves (rename never follows a link there, and never replaces anything but an empty
        directory). Directories the archive did not list get the mode they would have got."""
        tops = {rel.partition("/")[0] for rel in self.entries if "/" in rel or self.entries[rel][0] == "dir"}
        moved: set[str] = set()
        for top in sorted(t for t in tops if t and kinds.get(t) == "missing"):
            try:
                os.rename(top, top, src_dir_fd=self.stage_fd, dst_dir_fd=self.dest_fd)
            except OSError:
                continue
            moved.add(top)
        if moved:
            staged.reset()  # its cached descriptors point into the moved trees: walk anew
            implicit = {
                prefix
                for rel in self.entries
                if rel.partition("/")[0] in moved
                for prefix in itertools.accumulate(rel.split("/")[:-1], lambda a, b: f"{a}/{b}")
            } - {rel for rel, (kind, _, _) in self.entries.items() if kind == "dir"}
            for rel in implicit:
                os.fchmod(dest.get(rel, rel, create=False), self.agent.ws.dir_mode)
        return moved

    def _check_destination(self, dest: _DirWalker) -> dict[str, str]:
        """Refuse before moving anything: a symlink or a file on a member's way, or a kind clash.
        Returns what each path it looked at is in the workspace (``missing``, ``dir``, ...).

        The descriptors opened here (never following a link) are the ones the commit then uses.
        """
        kinds: dict[str, str] = {"": "dir"}

        def kind_of(rel: str) -> str:  # rel's parent is known to be a directory
            if rel not in kinds:
                head, _, name = rel.rpartition("/")
                try:
                    st = os.stat(name, dir_fd=dest.get(head, rel, create=False), follow_symlinks=False)
                except FileNotFoundError:
                    kinds[rel] = "missing"
                else:
                    mode = st.st_mode
                    kinds[rel] = "dir" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "file"
            return kinds[rel]

        for rel, (kind, _, _) in self.entries.items():
            if not rel:
                continue
            parts = rel.split("/")
            for i in range(1, len(parts)):
                above = "/".join(parts[:i])
                found = kind_of(above)
                if found == "link":
                    raise _refuse(
                        rel, f"{_clean(above)} is a symbolic link in the workspace; not writing through it"
                    )
                if found == "file":
                    raise OpError(
                        "conflict", f"{rel}: {_clean(above)} is a file in the workspace, not a directory"
                    )
                if found == "missing":
                    break
            else:
                found = kind_of(rel)
                if kind == "file" and found == "dir":
                    raise OpError("conflict", f"{rel}: is a directory in the workspace")
                if kind == "dir" and found != "dir" and found != "missing":
                    what = "a symbolic link" if found == "link" else "a file"
                    raise OpError("conflict", f"{rel}: is {what} in the workspace, not a directory")
        return kinds

    def _cleanup(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.stage_fd)
        try:
            shutil.rmtree(self.stage, dir_fd=self.dest_fd)
        except OSError as exc:
            print(f"agent: could not remove the staging directory: {exc!r}", file=sys.stderr)
        finally:
            os.close(self.dest_fd)
        for made in self.made:
            with contextlib.suppress(OSError):
                os.rmdir(made)


class _Exactly:
    """Reads exactly ``size`` bytes of an open file: zeros if it shrank meanwhile, cut if it grew."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._left = size

    def read(self, size: int = -1) -> bytes:
        want = self._left if size is None or size < 0 else min(size, self._left)
        data = os.read(self._fd, want) if want else b""
        if want and not data:
            data = bytes(want)
        self._left -= len(data)
        return data


class _Download:
    """One DownloadFiles: a tar written on its own thread; each ``tar_read`` takes the next chunk.

    The producer blocks until the host asks for more, so a slow client slows the walk instead of
    filling memory. Links are archived as links (never followed); devices, fifos and sockets are
    left out; every descriptor is opened without following links from the checked start.
    """

    def __init__(self, agent: Agent, path: str, max_bytes: int) -> None:
        ws = agent.ws
        self.agent = agent
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self.reads: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.buf = bytearray()
        self.stopped = False
        self.error: OpError | None = None
        self.total = 0
        real = ws._granted(path or ".", "r")
        fd = os.open(real, os.O_PATH | os.O_CLOEXEC)  # O_PATH follows nothing past the resolved name
        try:
            ws._verify_fd(fd, path, "r")
            mode = os.fstat(fd).st_mode
        finally:
            os.close(fd)
        if stat.S_ISDIR(mode):
            self.fd = ws._open_dir(real, path, "r")
            self.name = ""
        else:
            self.fd = ws._open_regular(real, path, os.O_RDONLY)
            self.name = os.path.basename(real)
        self.thread = threading.Thread(target=self._run, daemon=True, name="tar")
        self.thread.start()

    def read(self, rid: int) -> None:
        with self.lock:
            if not self.stopped:
                self.reads.put(rid)
                return
        self._answer_late(rid)

    def _answer_late(self, rid: int) -> None:
        _answer_late(self.agent, rid, self.error, {"eof": True})

    def abort(self) -> None:
        self.reads.put(None)

    # file object for tarfile
    def write(self, data: bytes) -> int:
        self.buf += data
        while len(self.buf) >= TAR_CHUNK:
            self._emit(bytes(self.buf[:TAR_CHUNK]))
            del self.buf[:TAR_CHUNK]
        return len(data)

    def _emit(self, chunk: bytes) -> None:
        rid = self.reads.get()
        if rid is None:
            raise _Aborted
        self.agent.send({"id": rid, "type": "result", "eof": False}, chunk)

    def _run(self) -> None:
        try:
            with tarfile.open(fileobj=self, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                tar.copybufsize = TAR_CHUNK  # file contents read in big pieces, not 16 KiB ones
                if self.name:
                    self._add_file(tar, self.fd, self.name)
                else:
                    self._add_tree(tar)
            if self.buf:
                self._emit(bytes(self.buf))
        except OpError as exc:
            self.error = exc
        except _Aborted:
            self.error = OpError("aborted", "the download was abandoned")
        except OSError as exc:
            self.error = _os_error(exc, "download")
        except Exception as exc:
            print(f"agent: download failed: {exc!r}", file=sys.stderr)
            self.error = OpError("internal", type(exc).__name__)
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            with self.lock:
                self.stopped = True
            while True:
                try:
                    rid = self.reads.get_nowait()
                except queue.Empty:
                    break
                if rid is not None:
                    self._answer_late(rid)

    def _info(self, name: str, st: os.stat_result) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.mode = stat.S_IMODE(st.st_mode)
        info.mtime = int(st.st_mtime)
        info.uid, info.gid = st.st_uid, st.st_gid
        return info

    def _add_file(self, tar: tarfile.TarFile, fd: int, name: str) -> None:
        st = os.fstat(fd)
        self.total += st.st_size
        if self.total > self.max_bytes:
            raise OpError(
                "too_large", f"{_clean(name)}: the files pass {self.max_bytes} bytes (max_download_bytes)"
            )
        info = self._info(name, st)
        info.size = st.st_size
        tar.addfile(info, _Exactly(fd, st.st_size))

    def _add_tree(self, tar: tarfile.TarFile) -> None:
        """Depth first, names sorted, one open descriptor per level (never recursing)."""
        stack: list[tuple[int, str, list[str]]] = [(self.fd, "", sorted(os.listdir(self.fd), reverse=True))]
        try:
            while stack:
                dfd, prefix, names = stack[-1]
                if not names:
                    stack.pop()
                    if dfd != self.fd:
                        os.close(dfd)
                    continue
                name = names.pop()
                rel = prefix + name
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        if len(stack) > MAX_DEPTH:
                            raise OpError("ENAMETOOLONG", f"{_clean(rel)}: more than {MAX_DEPTH} levels deep")
                        child = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                        try:
                            children = sorted(os.listdir(child), reverse=True)
                            info = self._info(rel, os.fstat(child))
                            info.type = tarfile.DIRTYPE
                            tar.addfile(info)
                        except BaseException:
                            os.close(child)
                            raise
                        stack.append((child, rel + "/", children))
                    elif stat.S_ISLNK(st.st_mode):
                        info = self._info(rel, st)
                        info.type = tarfile.SYMTYPE
                        info.linkname = os.readlink(name, dir_fd=dfd)
                        tar.addfile(info)
                    elif stat.S_ISREG(st.st_mode):
                        fd = os.open(
                            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
                        )
                        try:
                            if stat.S_ISREG(os.fstat(fd).st_mode):
                                self._add_file(tar, fd, rel)
                        finally:
                            os.close(fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # removed or replaced while walking: what is gone is not archived
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        continue  # became a link between the stat and the open
                    raise _os_error(exc, _clean(rel)) from None
        finally:
            for dfd, _, _ in stack:
                if dfd != self.fd:
                    os.close(dfd)


class _Transfers:
    """The agent's running uploads and downloads, by the id of the request that began each."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.lock = threading.Lock()
        self.uploads: dict[int, _Upload] = {}
        self.downloads: dict[int, _Download] = {}

    def handle(self, rid: int, header: Mapping[str, Any], payload: bytes) -> None:
        """Route one transfer op (called on the reader thread for chunks and reads: they never block)."""
        op = header["op"]
        if op == "untar_chunk":
            self._upload(header).chunk(rid, payload)
        elif op == "tar_read":
            self._download(header).read(rid)
        elif op == "tar_end":
            with self.lock:
                down = self.downloads.pop(_field(header, "download", int), None)
            if down is not None:
                down.abort()
            self.agent.send({"id": rid, "type": "result"})
        else:
            self.agent._pool.submit(self.agent._guarded, rid, self._slow, header)

    def _slow(self, rid: int, header: Mapping[str, Any]) -> None:
        op = header["op"]
        path = _field(header, "path", str, ".")
        try:
            if op == "untar_begin":
                up = _Upload(self.agent, path, _count(header, "max_files"), _count(header, "max_bytes"))
                with self.lock:
                    self.uploads[rid] = up
                self.agent.send({"id": rid, "type": "result", "upload": rid})
            elif op == "untar_end":
                upload_id = _field(header, "upload", int)
                with self.lock:
                    ending = self.uploads.pop(upload_id, None)
                if ending is None:
                    raise OpError("bad_request", f"no upload {upload_id}")
                result = ending.end(_field(header, "commit", bool))
                self.agent.send({"id": rid, "type": "result", **result})
            elif op == "tar_begin":
                down = _Download(self.agent, path, _count(header, "max_bytes"))
                with self.lock:
                    self.downloads[rid] = down
                self.agent.send({"id": rid, "type": "result", "download": rid})
        except OSError as exc:
            raise _os_error(exc, path) from None

    def _upload(self, header: Mapping[str, Any]) -> _Upload:
        upload_id = _field(header, "upload", int)
        with self.lock:
            up = self.uploads.get(upload_id)
        if up is None:
            raise OpError("bad_request", f"no upload {upload_id}")
        return up

    def _download(self, header: Mapping[str, Any]) -> _Download:
        download_id = _field(header, "download", int)
        with self.lock:
            down = self.downloads.get(download_id)
        if down is None:
            raise OpError("bad_request", f"no download {download_id}")
        return down


_TRANSFER_OPS = frozenset({"untar_begin", "untar_chunk", "untar_end", "tar_begin", "tar_read", "tar_end"})


AGENT_ENV_PREFIX = "DISPATCHER_AGENT_"  # reserved for the agent's own settings; never passed on
_DEFAULT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}


def command_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment every command starts from: the agent's own, which ``docker exec`` took from
    the container's configuration (the image's ``ENV``), minus the agent's reserved names, with
    defaults for what a shell expects."""
    env = {key: value for key, value in environ.items() if not key.startswith(AGENT_ENV_PREFIX)}
    for key, value in _DEFAULT_ENV.items():
        env.setdefault(key, value)
    return env


def parse_grants(raw: str | None) -> list[tuple[str, str]] | None:
    """The ``--grants`` JSON as (normalised relative prefix, mode) pairs; None when not given."""
    if raw is None:
        return None
    items = json.loads(raw)
    if not isinstance(items, list):
        raise ValueError("expected a JSON list")
    grants = []
    for item in items:
        if (
            not isinstance(item, dict)
            or type(item.get("path")) is not str
            or item.get("mode") not in ("r", "rw")
        ):
            raise ValueError(f"bad grant {item!r}")
        prefix = os.path.normpath(item["path"].strip("/") or ".")
        if prefix.split("/")[0] == ".." or "\x00" in prefix:
            raise ValueError(f"grant {item['path']!r} leaves the root")
        grants.append((prefix, item["mode"]))
    return grants


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point: serve the protocol on stdin/stdout for one workspace root."""
    parser = argparse.ArgumentParser(description="dispatcher sandbox agent")
    parser.add_argument(
        "--version", action="version", version=f"dispatcher-agent protocol {PROTOCOL_VERSION}"
    )
    parser.add_argument("--root", required=True, help="workspace root that every path must stay under")
    parser.add_argument("--grants", help='JSON list of {"path": prefix, "mode": "r" | "rw"}; omit: all')
    args = parser.parse_args(argv)
    if not os.path.isdir(args.root):
        print(f"agent: root {args.root!r} is not a directory", file=sys.stderr)
        return 2
    try:
        grants = parse_grants(args.grants)
    except ValueError as exc:
        print(f"agent: --grants: {exc}", file=sys.stderr)
        return 2
    # Keep private copies of the protocol fds and point 0/1 elsewhere, so a stray print or an
    # inherited descriptor can never write into (or read from) the protocol stream.
    inp = os.fdopen(os.dup(0), "rb", buffering=CHUNK)
    out = os.fdopen(os.dup(1), "wb", buffering=CHUNK)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _exit_on_signal)  # exit through serve()'s cleanup, killing commands
    agent = Agent(args.root, out, grants)
    return agent.serve(inp)


if __name__ == "__main__":
    sys.exit(main())
