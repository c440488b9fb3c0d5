"""The workspace: file operations confined to one root, with links resolved where the files are.

Every path is resolved here, inside the sandbox, and every descriptor opened is checked again
through ``/proc/self/fd`` against the root and the session's grants, so a symbolic link swapped in
after a check cannot carry an operation outside.

``approved`` paths (what a human approved, as ``resolve_exact`` gave it) are used exactly: walked
from the root one component at a time without following any link, failing with ``changed``
(nothing done) if a link, or a directory moved meanwhile, stands on the way.

With grants (``--grants '[{"path": "src", "mode": "rw"}, {"path": "pub", "mode": "r"}]'``) every
file operation, and a command's working directory, is refused with ``denied`` unless a grant
covers the place it actually opened.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading

from .protocol import MAX_PAYLOAD, Error, ListEntry, StatResult

LIST_SCAN_CAP = 100_000  # names read from one directory before giving up on a full sort
MAX_DEPTH = 1024  # directory levels below the root that a write may walk or create
MAX_SYMLINKS = 40  # links followed while resolving one path, as the kernel allows (then ELOOP)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OpError(Exception):
    """A request failed in an ordinary way; becomes an ``error`` response."""

    def __init__(self, code: str, message: str, processes: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.processes = processes
        """How many processes earlier commands left running (``proc_limit``)."""

    def reply(self) -> Error:
        """The ``error`` response it becomes."""
        return Error(self.code, self.message, self.processes)


def clean(name: str) -> str:
    """Make a file name from the disk JSON-safe (undecodable bytes become U+FFFD)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def realpath(path: str) -> str:
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


def os_error(exc: OSError, shown: str) -> OpError:
    code = errno.errorcode.get(exc.errno or 0, "EIO")
    # strerror only: the filename in the exception is a real path, which must not leak.
    message = f"{shown}: {exc.strerror or code}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        message += _owner_hint(exc.filename)
    return OpError(code, message)


def _owner_hint(filename: object) -> str:
    """Why a path of the workspace (absolute: the exception's) is refused to the sandbox user, when
    it or its directory belongs to another user; "" when that is not why."""
    if not isinstance(filename, str) or not filename.startswith("/"):
        return ""
    for path, what in ((filename, "the file"), (os.path.dirname(filename), "its directory")):
        try:
            return not_owned(os.lstat(path), what)
        except OSError:
            continue
    return ""


def not_owned(st: os.stat_result, what: str) -> str:
    """The hint for a ``Permission denied`` on something ``st`` describes, when the sandbox user
    does not own it (a file placed on the host as root, typically): whose it is and the fix."""
    me, group = os.geteuid(), os.getegid()
    if st.st_uid == me:
        return ""
    return (
        f" ({what} belongs to uid {st.st_uid}, not to the sandbox user, uid {me}: a file placed "
        f"in the workspace from the host must be owned by the sandbox user; on the host, "
        f"`chown {me}:{group}` it, or make it readable/writable for uid {me})"
    )


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
        real = realpath(joined)
        if not _inside(real, self.root):
            raise OpError("escape", f"{path}: path escapes the workspace")
        return real

    def relative(self, real: str) -> str:
        """Path under the root as the host should see it ('.' for the root itself)."""
        return clean(os.path.relpath(real, self.root))

    def open_dir(self, real_dir: str, shown: str, mode: str = "r", leaf: str | None = None) -> int:
        fd = os.open(real_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self.verify_fd(fd, shown, mode, leaf)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def verify_fd(self, fd: int, shown: str, mode: str = "r", leaf: str | None = None) -> None:
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

    def granted(self, path: str, mode: str) -> str:
        """``resolve`` plus the grant check on the real path (the fd checks repeat it at use)."""
        real = self.resolve(path)
        self.check_grant(real, path, mode)
        return real

    def _locate(self, path: str, approved: str | None = None) -> tuple[str, os.stat_result]:
        """Real path and stat of an existing path, taken from one descriptor checked for reading."""
        if approved is not None:
            return self._locate_approved(path, approved)
        real = self.granted(path, "r")
        fd = os.open(real, os.O_PATH | os.O_CLOEXEC)
        try:
            self.verify_fd(fd, path, "r")
            return real, os.fstat(fd)
        finally:
            os.close(fd)

    def open_cwd(self, path: str, approved: str | None = None) -> tuple[int, str]:
        """A verified descriptor of a command's working directory (see ``check_grant``), and its path."""
        try:
            if approved is not None:
                real = self.approved(approved, path, "cwd")
                return self.make_dirs(real, path, "cwd", None, create=False, pinned="run"), real
            real = self.granted(path, "cwd")
            return self.open_dir(real, path, "cwd"), real
        except NotADirectoryError:
            raise OpError("ENOTDIR", f"{path}: working directory is not a directory") from None
        except FileNotFoundError:
            raise OpError("ENOENT", f"{path}: working directory does not exist") from None

    def _lock(self, real: str) -> threading.Lock:
        return self._locks[hash(real) % len(self._locks)]

    def open_regular(
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
            self.verify_fd(fd, shown, mode)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read(self, path: str, max_bytes: int, strict: bool, approved: str | None = None) -> tuple[bytes, int]:
        """Return (at most ``max_bytes`` of the file, its size); ``too_large`` if strict and bigger."""
        if approved is None:
            fd = self.open_regular(self.granted(path, "r"), path, os.O_RDONLY)
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
        return self.make_dirs(parent, path, mode, name, create=create, pinned=pinned), name

    def make_dirs(
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
            self.verify_fd(fd, shown, mode, leaf)
            if pinned is not None and _moved(fd, real_dir):
                raise _changed(shown, pinned)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, path: str, data: bytes, approved: str | None = None, expect: str | None = None) -> None:
        """Atomically replace the file: temp file in the same directory, fsync, rename. With
        ``expect`` (a sha256, or "absent"), only if the file still is that just before the rename."""
        real = self.granted(path, "rw") if approved is None else self.approved(approved, path, "rw")
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
        tmp = f".~{os.urandom(6).hex()}.tmp"  # short: a long leaf name plus a suffix could overflow
        try:
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd
            )
        except PermissionError as exc:  # the directory is not the sandbox user's to write in
            hint = not_owned(os.fstat(dfd), "its directory")
            raise OpError("EACCES", f"{shown}: {exc.strerror}{hint}") from None
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
        real = self.granted(path, "rw")
        with self._lock(real):
            dfd, name = self._parent_fd(path, real)
            try:
                fd = self.open_regular(
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

    def exists(self, path: str) -> bool:
        """True if the resolved path exists."""
        try:
            self._locate(path)
        except OSError:
            return False
        return True

    def stat(self, path: str, approved: str | None = None) -> StatResult:
        """Kind, size, mode and mtime of the resolved path."""
        real, st = self._locate(path, approved)
        return StatResult(
            self.relative(real), _kind(st.st_mode), st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime
        )

    def list(self, path: str, limit: int, approved: str | None = None) -> tuple[list[ListEntry], bool]:
        """Up to ``limit`` entries sorted by name, and whether more existed."""
        if approved is None:
            dfd = self.open_dir(self.granted(path, "r"), path)  # listed through the checked fd
        else:
            real = self.approved(approved, path, "r")
            dfd = self.make_dirs(real, path, "r", None, create=False, pinned="listed")
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
                target = None
                if kind == "symlink":
                    try:
                        target = os.readlink(name, dir_fd=dfd)
                    except OSError:
                        target = ""
                entries.append(ListEntry(name, kind, st.st_size, target))
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
            return self.open_regular(name, shown, flags, dir_fd=dfd, mode=mode)
        except OSError as exc:
            if _is_link(exc, dfd, name):
                raise _changed(shown, pinned) from None
            raise

    def _locate_approved(self, path: str, approved: str) -> tuple[str, os.stat_result]:
        real = self.approved(approved, path, "r")
        if real == self.root:
            fd = self.make_dirs(real, path, "r", None, create=False, pinned="read")
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
        parent = realpath(head or "/")
        if not _inside(parent, self.root):
            raise OpError("escape", f"{path}: path escapes the workspace")
        self.check_grant(os.path.join(parent, name), path, "rw")
        dfd = self.open_dir(parent, path, "rw", name)
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
        import hashlib  # here: with secrets, it loaded OpenSSL (~4 MiB) into every idle agent

        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


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
