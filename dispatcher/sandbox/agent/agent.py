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
resolve path                                            path (real path, relative to the root)
exec   command, cwd, env, stdin (stdin bytes)           output* then exit: exit_code | signal
signal exec_id, signal (TERM | KILL | INT)              delivered
====== ================================================ ==========================================

Error codes: errno names (``ENOENT``, ``EISDIR``, ...), ``too_large``, ``no_match``,
``multiple_matches``, ``escape`` (resolves outside the root), ``denied`` (outside the fs grants),
and ``bad_request``, ``internal``, ``protocol`` (the host's fault or the agent's). ``id: null``
errors answer unparseable frames.

With ``--grants '[{"path": "src", "mode": "rw"}, {"path": "pub", "mode": "r"}]'`` every file
operation (and a command's working directory) is refused with ``denied`` unless a grant covers the
place it actually opened, checked on the opened descriptor through ``/proc/self/fd``: a symlink
swapped in after the host's check cannot carry an operation outside its grant.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import secrets
import selectors
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, NoReturn

PROTOCOL_VERSION = 1
PREFIX = struct.Struct(">II")
MAX_HEADER = 1 << 20
MAX_PAYLOAD = 64 << 20
CHUNK = 64 * 1024  # largest output frame
COALESCE_SECONDS = 0.01  # small writes wait this long for company before being sent
DRAIN_SECONDS = 0.2  # after sh exits, how long background children may keep the pipes busy
LIST_SCAN_CAP = 100_000  # names read from one directory before giving up on a full sort
MAX_DEPTH = 1024  # directory levels below the root that a write may walk or create
MAX_SYMLINKS = 40  # links followed while resolving one path, as the kernel allows (then ELOOP)
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

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _field(header: Mapping[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    value = header.get(key, default)
    if value is ... or type(value) is not kind:
        raise OpError("bad_request", f"field {key!r} must be {kind.__name__}")
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

    def _locate(self, path: str) -> tuple[str, os.stat_result]:
        """Real path and stat of an existing path, taken from one descriptor checked for reading."""
        real = self._granted(path, "r")
        fd = os.open(real, os.O_PATH | os.O_CLOEXEC)
        try:
            self._verify_fd(fd, path, "r")
            return real, os.fstat(fd)
        finally:
            os.close(fd)

    def open_cwd(self, path: str) -> tuple[int, str]:
        """A verified descriptor of a command's working directory (see ``check_grant``), and its path."""
        real = self._granted(path, "cwd")
        try:
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

    def read(self, path: str, max_bytes: int, strict: bool) -> tuple[bytes, int]:
        """Return (at most ``max_bytes`` of the file, its size); ``too_large`` if strict and bigger."""
        fd = self._open_regular(self._granted(path, "r"), path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            if strict and size > max_bytes:
                raise OpError("too_large", f"{path}: file is {size} bytes, more than {max_bytes}")
            data = f.read(max_bytes)
        return data, size

    def _parent_fd(self, path: str, real: str) -> tuple[int, str]:
        if real == self.root:
            raise OpError("EISDIR", f"{path}: is the workspace root")
        parent, name = os.path.split(real)
        return self._make_dirs(parent, path, "rw", name), name

    def _make_dirs(self, real_dir: str, shown: str, mode: str, leaf: str) -> int:
        """A verified descriptor of ``real_dir`` (inside the root), making missing directories.

        One component at a time from the root through directory descriptors, never recursing (a
        deep path cannot exhaust the stack) and never following a link (one planted after
        ``resolve`` is refused, not followed).
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
                    with contextlib.suppress(FileExistsError):  # made meanwhile: fine
                        os.mkdir(part, 0o777, dir_fd=fd)
                    child = os.open(part, flags, dir_fd=fd)
                fd, parent_fd = child, fd
                os.close(parent_fd)
            self._verify_fd(fd, shown, mode, leaf)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, path: str, data: bytes) -> None:
        """Atomically replace the file: temp file in the same directory, fsync, rename."""
        real = self._granted(path, "rw")
        with self._lock(real):
            dfd, name = self._parent_fd(path, real)
            try:
                self._replace(dfd, name, data, path)
            finally:
                os.close(dfd)

    def _replace(self, dfd: int, name: str, data: bytes, shown: str) -> None:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            mode = self._new_mode
        else:
            if stat.S_ISDIR(st.st_mode):
                raise OpError("EISDIR", f"{shown}: is a directory")
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

    def patch(self, path: str, old: bytes, new: bytes) -> None:
        """Replace the single occurrence of ``old``; the file is untouched on any failure."""
        if not old:
            raise OpError("no_match", f"{path}: the text to replace is empty")
        real = self._granted(path, "rw")
        with self._lock(real):
            data, _ = self.read(path, MAX_PAYLOAD, True)
            count = data.count(old)  # UTF-8 is self-synchronising, so byte matches are char matches
            if count == 0:
                raise OpError("no_match", f"{path}: the text to replace was not found")
            if count > 1:
                raise OpError("multiple_matches", f"{path}: the text to replace occurs {count} times")
            dfd, name = self._parent_fd(path, real)
            try:
                self._replace(dfd, name, data.replace(old, new, 1), path)
            finally:
                os.close(dfd)

    def exists(self, path: str) -> bool:
        """True if the resolved path exists."""
        try:
            self._locate(path)
        except OSError:
            return False
        return True

    def stat(self, path: str) -> dict[str, Any]:
        """Kind, size, mode and mtime of the resolved path."""
        real, st = self._locate(path)
        return {
            "path": self.relative(real),
            "kind": _kind(st.st_mode),
            "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode),
            "mtime": st.st_mtime,
        }

    def list(self, path: str, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """Up to ``limit`` entries sorted by name, and whether more existed."""
        dfd = self._open_dir(self._granted(path, "r"), path)  # listed through the checked fd
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


class Agent:
    """Reads requests, runs each on a worker thread, writes responses under one lock."""

    def __init__(self, root: str, out: IO[bytes], grants: list[tuple[str, str]] | None = None) -> None:
        self.ws = Workspace(root, grants)
        self._out = out
        self._out_lock = threading.Lock()
        self._execs: dict[int, _Exec] = {}
        self._execs_lock = threading.Lock()
        self._lingering: set[int] = set()  # groups of finished commands that left children running
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="file-op")
        self._env = {
            "PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
        }

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
        try:
            while True:
                prefix = inp.read(PREFIX.size)
                if not prefix:
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
            self.shutdown()

    def shutdown(self) -> None:
        """Kill every running command; nothing may outlive the agent."""
        with self._execs_lock:
            running = list(self._execs.values())
            lingering = list(self._lingering)
        for ex in running:
            ex.signal(signal.SIGKILL)
        for pgid in lingering:  # background children (`cmd &`) outlive their command, not the agent
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
            threading.Thread(
                target=self._guarded, args=(rid, self._exec, header, payload), daemon=True
            ).start()
        elif op in _FILE_OPS:
            self._pool.submit(self._guarded, rid, self._file_op, header, payload)
        else:
            self.send({"id": rid, "type": "error", "code": "bad_request", "message": f"unknown op {op!r}"})

    def _guarded(self, rid: int, handler: Any, *args: Any) -> None:
        try:
            handler(rid, *args)
        except OpError as exc:
            self.send({"id": rid, "type": "error", "code": exc.code, "message": exc.message})
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
        ws = self.ws
        result: dict[str, Any] = {}
        body = b""
        try:
            if op == "read":
                body, result["size"] = ws.read(
                    path, _count(header, "max_bytes"), _field(header, "strict", bool)
                )
            elif op == "write":
                ws.write(path, payload)
            elif op == "append":
                ws.append(path, payload)
            elif op == "patch":
                split = _field(header, "old_len", int)
                if not 0 <= split <= len(payload):
                    raise OpError("bad_request", "old_len out of range")
                ws.patch(path, payload[:split], payload[split:])
            elif op == "exists":
                result["exists"] = ws.exists(path)
            elif op == "stat":
                result.update(ws.stat(path))
            elif op == "list":
                entries, result["truncated"] = ws.list(path, _count(header, "limit"))
                body = json.dumps(entries).encode("ascii")  # ASCII: lone surrogates survive
            elif op == "delete":
                ws.delete(path)
            elif op == "resolve":
                result["path"] = ws.relative(ws.resolve(path))
        except OSError as exc:
            raise _os_error(exc, path) from None
        self.send({"id": rid, "type": "result", **result}, body)

    def _exec(self, rid: int, header: Mapping[str, Any], payload: bytes) -> None:
        command = _field(header, "command", str)
        cwd_arg = _field(header, "cwd", str, ".")
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
            cwd_fd, cwd = self.ws.open_cwd(cwd_arg)
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
                cwd = fd_path if os.path.isdir(fd_path) else cwd
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
        except OSError as exc:
            raise _os_error(exc, "/bin/sh") from None
        with ex.lock:
            ex.pgid = proc.pid
            for sig in ex.early:
                _killpg(proc.pid, sig)
        if stdin is not None:
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
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
