"""Copying a directory tree a sandbox wrote (a session's workspace, a container's ``/tmp``) for
snapshots and forks, bounded while it copies: every entry and every byte is charged to a
``CopyBudget`` before it is written, so a tree larger than the budget stops the copy there instead
of filling the server's disk first. ``cp -a`` cannot be told to stop at a size, and measuring first
then copying would let a file that grows in between (a workspace other sessions share is not
frozen) pass the bound.

Every step goes through directory file descriptors with ``O_NOFOLLOW``: a symlink in the tree is
copied as a symlink and never followed, so nothing outside the tree is read or written whatever it
points at. Owners, modes (set-id bits dropped), times and hard links within the tree are kept;
fifos, sockets and devices are counted as entries and skipped (they hold no contents to keep). File
data moves with ``copy_file_range`` (copy-on-write where the filesystem offers it), read and write
where it cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
from collections.abc import Callable

from dispatcher.core.errors import DispatcherError
from dispatcher.core.provider_api import BLOCK, CopyBudget

__all__ = ["MAX_DEPTH", "TreeCopyError", "TreeTooDeep", "copy_tree", "run_copy"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: an entry swapped for a fifo since it was listed must not hang the copy on its open.
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 8 << 20
"""Bytes moved per system call (the budget is looked at between them)."""
MAX_DEPTH = 256
"""Directories nested deeper are refused (each level holds two descriptors and a stack frame)."""
_NO_RANGE = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM})


class TreeCopyError(OSError):
    """The copy could not be completed (the message says where)."""


class TreeTooDeep(DispatcherError, ValueError):
    """The tree nests directories deeper than ``MAX_DEPTH``: the tree must change, a retry will
    not help (the message says where)."""


def copy_tree(source: str, dest: str, budget: CopyBudget, *, label: str = "", keep_root: bool = False) -> int:
    """Copy the directory ``source``'s contents into the directory ``dest`` (made if missing, mode
    0700), charging ``budget``; returns the bytes of file data copied. ``label``: the name the
    budget's messages give the root (``workspace``); ``keep_root``: give ``dest`` the owner, mode
    and times of ``source`` too (as ``cp -a source/. dest`` does).

    Raises:
        CopyBudgetExceeded: the next entry or byte would pass ``budget`` (what was written stays:
            the caller removes the copy).
        TreeTooDeep: the tree is deeper than ``MAX_DEPTH`` (what was written stays).
        TreeCopyError: ``source`` or ``dest`` could not be opened.
        OSError: reading or writing failed.
    """
    try:
        src = os.open(source, _DIR)
    except OSError as exc:
        raise TreeCopyError(f"cannot open {source}: {exc.strerror}") from exc
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(dest, 0o700)
        try:
            dst = os.open(dest, _DIR)
        except OSError as exc:
            raise TreeCopyError(f"cannot open {dest}: {exc.strerror}") from exc
        try:
            copier = _Copier(budget, label, dst)
            copier.copy_dir(src, dst, ())
            if keep_root:
                _keep_meta(dst, os.fstat(src))
            return copier.copied
        finally:
            os.close(dst)
    finally:
        os.close(src)


async def run_copy(budget: CopyBudget, copy: Callable[[], int]) -> int:
    """Run ``copy`` (a copy charging ``budget``) in a thread. If the caller is cancelled, the
    budget is stopped and the thread waited for (it ends at its next entry or chunk) before the
    cancellation goes on, so nothing is written after the caller removes the copy."""
    running = asyncio.ensure_future(asyncio.to_thread(copy))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        budget.stop()
        with contextlib.suppress(Exception):
            await running
        raise


class _Copier:
    def __init__(self, budget: CopyBudget, label: str, root: int) -> None:
        self.budget = budget
        self.label = label
        self.root = root
        self.copied = 0
        self.ranged = True
        """``copy_file_range`` works between these two trees (until it is refused once)."""
        self.linked: dict[tuple[int, int], str] = {}
        """Files with more than one link: (device, inode) → the first copy's path under the root."""

    def where(self, rel: tuple[str, ...]) -> str:
        return "/".join((self.label, *rel) if self.label else rel) or "."

    def copy_dir(self, src: int, dst: int, rel: tuple[str, ...]) -> None:
        if len(rel) >= MAX_DEPTH:
            raise TreeTooDeep(
                f"{self.where(rel)}: directories nested deeper than {MAX_DEPTH} levels, more than a"
                " copy keeps; flatten or remove that tree"
            )
        for name in os.listdir(src):
            here = (*rel, name)
            try:
                st = os.stat(name, dir_fd=src, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since it was listed (a workspace another session writes)
            if stat.S_ISDIR(st.st_mode):
                self.budget.entry(self.where(here), BLOCK)
                self.copy_subdir(name, src, dst, here, st)
            elif stat.S_ISREG(st.st_mode):
                self.budget.entry(self.where(here))
                self.copy_file(name, src, dst, here, st)
            elif stat.S_ISLNK(st.st_mode):
                self.budget.entry(self.where(here))
                target = os.readlink(name, dir_fd=src)
                try:
                    os.symlink(target, name, dir_fd=dst)
                except FileExistsError:
                    continue
                os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
                os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)
            else:
                self.budget.entry(self.where(here))  # a fifo, socket or device: skipped

    def copy_subdir(self, name: str, src: int, dst: int, here: tuple[str, ...], st: os.stat_result) -> None:
        with contextlib.suppress(FileExistsError):  # one the destination has ($HOME in a new /tmp)
            os.mkdir(name, 0o700, dir_fd=dst)
        sub_src = os.open(name, _DIR, dir_fd=src)
        try:
            sub_dst = os.open(name, _DIR, dir_fd=dst)
            try:
                self.copy_dir(sub_src, sub_dst, here)
                _keep_meta(sub_dst, st)
            finally:
                os.close(sub_dst)
        finally:
            os.close(sub_src)

    def copy_file(self, name: str, src: int, dst: int, here: tuple[str, ...], st: os.stat_result) -> None:
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1:
            first = self.linked.get(key)
            if first is not None:
                with contextlib.suppress(FileExistsError):
                    os.link(first, name, src_dir_fd=self.root, dst_dir_fd=dst, follow_symlinks=False)
                return
        try:
            fin = os.open(name, _READ, dir_fd=src)
        except FileNotFoundError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fin).st_mode):
                return  # swapped for something else since it was listed
            fout = os.open(name, _WRITE, 0o600, dir_fd=dst)
            try:
                copied = self.copy_data(fin, fout, here)
                # Past the budget by a byte at most: a file that grew while copied stops here.
                self.budget.charge(self.where(here), copied)
                self.copied += copied
                _keep_meta(fout, st)
            finally:
                os.close(fout)
        finally:
            os.close(fin)
        if st.st_nlink > 1:
            self.linked[key] = "/".join(here)

    def copy_data(self, fin: int, fout: int, here: tuple[str, ...]) -> int:
        """At most the budget's bytes left and one more, so a file past it is known to be."""
        limit = self.budget.bytes_left + 1
        copied = 0
        while copied < limit:
            self.budget.charge(self.where(here), 0)  # raises once the copy was stopped
            want = min(CHUNK, limit - copied)
            if self.ranged:
                try:
                    n = os.copy_file_range(fin, fout, want)
                except OSError as exc:
                    if exc.errno not in _NO_RANGE:
                        raise
                    # Across filesystems, or not offered: the offsets are where they were.
                    self.ranged = False
                    continue
            else:
                n = _read_write(fin, fout, want)
            if not n:
                break
            copied += n
        return copied


def _read_write(fin: int, fout: int, want: int) -> int:
    chunk = os.read(fin, min(want, 1 << 20))
    view = memoryview(chunk)
    while view:
        view = view[os.write(fout, view) :]
    return len(chunk)


def _keep_meta(fd: int, st: os.stat_result) -> None:
    os.fchown(fd, st.st_uid, st.st_gid)
    # No set-id bit survives a copy (the tmpfs is nosuid anyway; a copy must not need it to be).
    os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
