"""Downloads (DownloadFiles): a tar of a workspace path, made as the host reads it."""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import stat
import sys
import threading

from .protocol import Send, TarChunk
from .tarformat import BLOCK, DIRECTORY, SYMLINK, header, trailer
from .workspace import DIR_FLAGS, MAX_DEPTH, OpError, Workspace, clean, os_error

TAR_CHUNK = 1 << 20  # bytes of archive in one tar_read answer


class _Aborted(Exception):
    """The host gave up on the download; the producer thread stops quietly."""


class Download:
    """One DownloadFiles: a tar written on its own thread; each ``tar_read`` takes the next chunk.

    The producer blocks until the host asks for more, so a slow client slows the walk instead of
    filling memory. Links are archived as links (never followed); devices, fifos and sockets are
    left out; every descriptor is opened without following links from the checked start.
    """

    def __init__(self, ws: Workspace, send: Send, path: str, max_bytes: int) -> None:
        self.send = send
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self.reads: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        # The next chunk, filled in place: file contents are read straight into it.
        self.buf = bytearray(TAR_CHUNK)
        self.view = memoryview(self.buf)
        self.filled = 0
        self.written = 0  # archive bytes so far
        self.stopped = False
        self.error: OpError | None = None
        self.total = 0
        real = ws.granted(path or ".", "r")
        fd = os.open(real, os.O_PATH | os.O_CLOEXEC)  # O_PATH follows nothing past the resolved name
        try:
            ws.verify_fd(fd, path, "r")
            mode = os.fstat(fd).st_mode
        finally:
            os.close(fd)
        if stat.S_ISDIR(mode):
            self.fd = ws.open_dir(real, path, "r")
            self.name = ""
        else:
            self.fd = ws.open_regular(real, path, os.O_RDONLY)
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
        """Answer a read that came after the archive ended: its error, or the end."""
        self.send(rid, self.error.reply() if self.error is not None else TarChunk(True))

    def abort(self) -> None:
        self.reads.put(None)

    def _put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            step = min(len(view), TAR_CHUNK - self.filled)
            self.view[self.filled : self.filled + step] = view[:step]
            self.filled += step
            view = view[step:]
            if self.filled == TAR_CHUNK:
                self._emit()

    def _put_contents(self, fd: int, size: int) -> None:
        """Exactly ``size`` bytes of an open file: zeros if it shrank meanwhile, cut if it grew."""
        left = size
        while left:
            step = min(left, TAR_CHUNK - self.filled)
            target = self.view[self.filled : self.filled + step]
            got = os.readv(fd, [target])
            if not got:
                target[:] = bytes(step)
                got = step
            self.filled += got
            left -= got
            if self.filled == TAR_CHUNK:
                self._emit()
        self._put(bytes(-size % BLOCK))

    def _emit(self) -> None:
        rid = self.reads.get()
        if rid is None:
            raise _Aborted
        chunk = bytes(self.view[: self.filled])
        self.written += self.filled
        self.filled = 0
        self.send(rid, TarChunk(False, chunk))

    def _run(self) -> None:
        try:
            if self.name:
                self._add_file(self.fd, self.name)
            else:
                self._add_tree()
            self._put(trailer(self.written + self.filled))
            if self.filled:
                self._emit()
        except OpError as exc:
            self.error = exc
        except _Aborted:
            self.error = OpError("aborted", "the download was abandoned")
        except OSError as exc:
            self.error = os_error(exc, "download")
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

    def _header(self, name: str, kind: bytes, st: os.stat_result, size: int = 0, link: str = "") -> None:
        mode = stat.S_IMODE(st.st_mode)
        self._put(header(name, kind, mode, st.st_uid, st.st_gid, size, int(st.st_mtime), link))

    def _add_file(self, fd: int, name: str) -> None:
        st = os.fstat(fd)
        self.total += st.st_size
        if self.total > self.max_bytes:
            raise OpError(
                "too_large", f"{clean(name)}: the files pass {self.max_bytes} bytes (max_download_bytes)"
            )
        self._header(name, b"0", st, st.st_size)
        self._put_contents(fd, st.st_size)

    def _add_tree(self) -> None:
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
                            raise OpError("ENAMETOOLONG", f"{clean(rel)}: more than {MAX_DEPTH} levels deep")
                        child = os.open(name, DIR_FLAGS, dir_fd=dfd)
                        try:
                            children = sorted(os.listdir(child), reverse=True)
                            self._header(rel + "/", DIRECTORY, os.fstat(child))
                        except BaseException:
                            os.close(child)
                            raise
                        stack.append((child, rel + "/", children))
                    elif stat.S_ISLNK(st.st_mode):
                        self._header(rel, SYMLINK, st, link=os.readlink(name, dir_fd=dfd))
                    elif stat.S_ISREG(st.st_mode):
                        fd = os.open(
                            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd
                        )
                        try:
                            if stat.S_ISREG(os.fstat(fd).st_mode):
                                self._add_file(fd, rel)
                        finally:
                            os.close(fd)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # removed or replaced while walking: what is gone is not archived
                except OSError as exc:
                    if exc.errno == errno.ELOOP:
                        continue  # became a link between the stat and the open
                    raise os_error(exc, clean(rel)) from None
        finally:
            for dfd, _, _ in stack:
                if dfd != self.fd:
                    os.close(dfd)
