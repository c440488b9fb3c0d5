"""Uploads (UploadFiles): the chunks of a tar stream, extracted into the workspace all or nothing."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import posixpath
import queue
import shutil
import stat
import sys
import threading
from collections.abc import Mapping

from .protocol import Done, Send, UntarResult
from .tarformat import (
    DIRECTORY,
    REGULAR,
    SYMLINK,
    BadMember,
    Member,
    TarFormatError,
    TarReader,
    Truncated,
)
from .workspace import DIR_FLAGS, MAX_DEPTH, OpError, Workspace, clean, os_error

WALKER_FDS = 512  # directory descriptors one upload keeps open at most (per tree it walks)
STAGE_PREFIX = ".~upload-"  # hidden staging directory of an upload, inside its destination


def _refuse(member: str, why: str) -> OpError:
    return OpError("refused", f"{member}: {why}")


def _member_path(name: str) -> str:
    """The member's name as a normalised relative path ('' for the destination itself)."""
    if "\x00" in name:
        raise _refuse(clean(name), "name contains a NUL byte")
    if name.startswith("/"):
        raise _refuse(clean(name), "absolute name")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise _refuse(clean(name), "'..' in the name leaves the destination")
    if len(parts) > MAX_DEPTH:
        raise _refuse(clean(name[:200]), f"more than {MAX_DEPTH} directories deep")
    if parts and parts[0].startswith(STAGE_PREFIX):
        raise _refuse(clean(name), f"names starting with {STAGE_PREFIX!r} are reserved")
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
                return os.open(name, DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, self._dir_mode, dir_fd=parent)
                return os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise _refuse(
                    member, f"{clean(rel)} in {self._what} is not a directory (a file or a symlink)"
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
    """An upload's chunks, taken one by one by the extractor thread.

    A chunk is acknowledged when taken, so the host (which keeps a small window of unacknowledged
    chunks) never sends much more than the extractor has consumed.
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self._queue: queue.SimpleQueue[tuple[int | None, bytes]] = queue.SimpleQueue()
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

    def take(self) -> bytes:
        """The next chunk (whole: its file contents are written from it without a copy), or
        ``b""`` at the end of the archive."""
        while not self._eof:
            rid, data = self._queue.get()
            if rid is None:
                self._eof = True
                break
            self._send(rid, Done())
            if data:
                return data
        return b""


class Upload:
    """One UploadFiles: chunks -> a tar stream -> files in a staging directory -> into place.

    Every member is checked before anything is written (name, type, mode bits, limits). Files
    are extracted into a hidden staging directory inside the destination, so a refused member,
    a breached limit or a full disk leaves the workspace as it was. After the whole archive
    passed, the destination is checked (no symlink or file where a directory must be, no
    directory where a file goes) and then each file is renamed into place (atomic per file).
    """

    def __init__(self, ws: Workspace, send: Send, path: str, max_files: int, max_bytes: int) -> None:
        self.ws = ws
        self.send = send
        self.shown = path
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self.finished = threading.Event()
        self.stopped = False
        self.error: OpError | None = None
        self.feed = _ChunkFeed(send)
        self.entries: dict[str, tuple[str, int, float]] = {}  # rel -> (kind, mode, mtime)
        self.files = self.bytes = 0
        self.umask = 0o777 & ~ws.dir_mode
        real = ws.granted(path or ".", "rw")
        # Directories made for this upload's destination go again if it fails (when still empty).
        self.made: list[str] = []  # deepest first
        missing = real
        while missing != ws.root and not os.path.lexists(missing):
            self.made.append(missing)
            missing = os.path.dirname(missing)
        try:
            self.dest_fd = ws.make_dirs(real, path or ".", "rw", "")
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise OpError("ENOTDIR", f"{path}: not a directory") from None
            raise
        try:
            self.stage = f"{STAGE_PREFIX}{os.urandom(6).hex()}"
            os.mkdir(self.stage, 0o700, dir_fd=self.dest_fd)
            self.stage_fd = os.open(self.stage, DIR_FLAGS, dir_fd=self.dest_fd)
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
        """Answer a chunk that came after the extractor stopped: its error, or (past the end of
        the archive) nothing to say."""
        self.send(rid, self.error.reply() if self.error is not None else Done())

    def _run(self) -> None:
        member = "(archive)"
        try:
            staged = _DirWalker(self.stage_fd, "the upload", 0o700)
            try:
                tar = TarReader(self.feed.take)
                info = tar.next()
                while info is not None:
                    member = clean(info.name)
                    self._extract(tar, info, member, staged)
                    info = tar.next()
            finally:
                staged.close()
        except OpError as exc:
            self.error = exc
        except BadMember as exc:
            self.error = OpError("bad_archive", f"{clean(exc.member)}: {exc}")
        except TarFormatError as exc:
            self.error = OpError("bad_archive", f"not a valid tar archive at {member}: {exc}")
        except OSError as exc:
            self.error = os_error(exc, member)
        except Exception as exc:
            print(f"agent: upload failed: {exc!r}", file=sys.stderr)
            self.error = OpError("internal", type(exc).__name__)
        finally:
            with self.lock:
                self.stopped = True
            for rid in self.feed.drain():
                self._answer_late(rid)
            self.finished.set()

    def _extract(self, tar: TarReader, info: Member, member: str, staged: _DirWalker) -> None:
        rel = _member_path(info.name)
        if info.type == SYMLINK:
            self._link(info, rel, member, staged)
            return
        if info.type == b"1":
            raise _refuse(member, "is a hard link (uploads carry files and directories only)")
        if info.type in (b"3", b"4"):
            raise _refuse(member, "is a device node")
        if info.type == b"6":
            raise _refuse(member, "is a fifo")
        if info.sparse:
            raise _refuse(member, "is a sparse file")
        is_dir = info.type == DIRECTORY
        if not (info.type in REGULAR or is_dir):
            raise _refuse(member, f"has an unsupported type {info.type!r}")
        if info.mode & stat.S_ISUID:
            raise _refuse(member, "has the setuid bit")
        if info.mode & stat.S_ISGID:
            raise _refuse(member, "has the setgid bit")
        if len(self.entries) >= self.max_files and rel not in self.entries:
            raise OpError("too_large", f"{member}: more than {self.max_files} entries (max_upload_files)")
        mode = stat.S_IMODE(info.mode) & 0o777
        if is_dir:
            if rel:
                staged.get(rel, member, create=True)
            self.entries[rel] = ("dir", mode, float(info.mtime))
            return
        if not rel:
            raise _refuse(member, "a file cannot replace the destination directory")
        if self.bytes + info.size > self.max_bytes:
            raise OpError("too_large", f"{member}: the files pass {self.max_bytes} bytes (max_upload_bytes)")
        name, pfd, previous = self._replaceable(rel, member, staged)
        # Made with its final mode (inside the private staging directory); fchmod only where the
        # umask would take bits away.
        fd = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=pfd
        )
        try:
            try:
                for view in tar.contents():  # views of the chunks: written without a copy
                    while view:
                        view = view[os.write(fd, view) :]
            except Truncated:
                raise OpError("bad_archive", f"{member}: the archive ends inside this file") from None
            if mode & self.umask:
                os.fchmod(fd, mode)
            os.utime(fd, (info.mtime, info.mtime))
        finally:
            os.close(fd)
        self.bytes += info.size
        if previous is None or previous[0] != "file":
            self.files += 1
        self.entries[rel] = ("file", mode, float(info.mtime))

    def _replaceable(
        self, rel: str, member: str, staged: _DirWalker
    ) -> tuple[str, int, tuple[str, int, float] | None]:
        """(name, its staged directory's fd, the earlier entry) for a file or link member;
        an earlier file or link of the same name is removed (the last one wins), never followed.
        Its directory is walked without following links, so a member whose path goes through a
        symlink made earlier in the archive is refused naming it."""
        previous = self.entries.get(rel)
        if previous is not None and previous[0] == "dir":
            raise _refuse(member, "a file with the name of a directory earlier in the archive")
        head, _, name = rel.rpartition("/")
        pfd = staged.get(head, member, create=True)
        if previous is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=pfd)
        return name, pfd, previous

    def _link(self, info: Member, rel: str, member: str, staged: _DirWalker) -> None:
        """A relative symlink whose target stays inside the upload (checked lexically, from the
        link's directory, against the upload's root); made with symlinkat, never followed here."""
        target = info.linkname
        if not rel:
            raise _refuse(member, "a symbolic link cannot replace the destination directory")
        if not target or "\x00" in target:
            raise _refuse(member, "is a symbolic link with an empty or NUL-holding target")
        if target.startswith("/"):
            raise _refuse(member, f"is a symbolic link to an absolute path ({clean(target[:200])})")
        parts = [p for p in target.split("/") if p not in ("", ".")]
        ups = next((i for i, p in enumerate(parts) if p != ".."), len(parts))
        if ".." in parts[ups:]:
            # "l -> x/../y" follows x first: were x a link, ".." would climb from where x points.
            raise _refuse(member, f"is a symbolic link with '..' after a name ({clean(target[:200])})")
        landed = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if landed == ".." or landed.startswith("../"):
            raise _refuse(member, f"is a symbolic link leaving the uploaded tree ({clean(target[:200])})")
        if len(self.entries) >= self.max_files and rel not in self.entries:
            raise OpError("too_large", f"{member}: more than {self.max_files} entries (max_upload_files)")
        name, pfd, _ = self._replaceable(rel, member, staged)
        os.symlink(target, name, dir_fd=pfd)
        self.entries[rel] = ("link", 0o777, float(info.mtime))

    # -- the end ---------------------------------------------------------------------------------

    def end(self, commit: bool) -> UntarResult:
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
            dirs = sum(1 for k, _, _ in self.entries.values() if k == "dir")
            return UntarResult(self.files, dirs, self.bytes)
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
                if kind in ("file", "link") and rel.partition("/")[0] not in moved:
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
                os.fchmod(dest.get(rel, rel, create=False), self.ws.dir_mode)
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
                        rel, f"{clean(above)} is a symbolic link in the workspace; not writing through it"
                    )
                if found == "file":
                    raise OpError(
                        "conflict", f"{rel}: {clean(above)} is a file in the workspace, not a directory"
                    )
                if found == "missing":
                    break
            else:
                found = kind_of(rel)
                if kind in ("file", "link") and found == "dir":
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
