"""Copying a container's ``/tmp`` (a tmpfs, which ``docker cp`` cannot see) out of it and into
another, from the host through ``/proc/PID/root``: for snapshots and forks.

Every step goes through directory file descriptors with ``O_NOFOLLOW``: a symlink a sandbox left in
``/tmp`` is copied as a symlink and never followed, so nothing outside the container's ``/tmp`` is
read or written whatever it points at. A copy out is taken with the container frozen (nothing in it
can swap a directory for a link meanwhile); a copy in goes into a container no session command ran
in yet. Owners, modes (set-id bits dropped) and times are kept; fifos, sockets and devices are
skipped.
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["TmpCopyError", "copy_in", "copy_out"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_ENTRIES = 1_000_000
"""Entries copied at most (a tmpfs full of empty files would otherwise copy forever)."""


class TmpCopyError(OSError):
    """The copy could not be completed (the message says where)."""


def copy_out(pid: int, dest: str) -> int:
    """Copy the ``/tmp`` of the process ``pid``'s container into the new directory ``dest``;
    returns the bytes of file data copied."""
    os.makedirs(dest, mode=0o700)
    return _copy_between(f"/proc/{pid}/root/tmp", dest)


def copy_in(source: str, pid: int) -> int:
    """Copy the directory ``source``'s contents into the ``/tmp`` of ``pid``'s container."""
    return _copy_between(source, f"/proc/{pid}/root/tmp")


def _copy_between(source: str, dest: str) -> int:
    try:
        src = os.open(source, _DIR)
    except OSError as exc:
        raise TmpCopyError(f"cannot open {source}: {exc.strerror}") from exc
    try:
        dst = os.open(dest, _DIR)
    except OSError as exc:
        os.close(src)
        raise TmpCopyError(f"cannot open {dest}: {exc.strerror}") from exc
    counter = [0]
    try:
        return _copy_dir(src, dst, counter)
    finally:
        os.close(src)
        os.close(dst)


def _copy_dir(src: int, dst: int, counter: list[int]) -> int:
    copied = 0
    for name in os.listdir(src):
        counter[0] += 1
        if counter[0] > MAX_ENTRIES:
            raise TmpCopyError(f"more than {MAX_ENTRIES} entries in /tmp")
        st = os.stat(name, dir_fd=src, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            with contextlib.suppress(FileExistsError):  # one the new /tmp has ($HOME, made at start)
                os.mkdir(name, 0o700, dir_fd=dst)
            sub_src = os.open(name, _DIR, dir_fd=src)
            try:
                sub_dst = os.open(name, _DIR, dir_fd=dst)
                try:
                    copied += _copy_dir(sub_src, sub_dst, counter)
                    _keep_meta(sub_dst, st)
                finally:
                    os.close(sub_dst)
            finally:
                os.close(sub_src)
        elif stat.S_ISREG(st.st_mode):
            copied += _copy_file(name, src, dst, st)
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=src)
            try:
                os.symlink(target, name, dir_fd=dst)
            except FileExistsError:
                continue
            os.chown(name, st.st_uid, st.st_gid, dir_fd=dst, follow_symlinks=False)
    return copied


def _copy_file(name: str, src: int, dst: int, st: os.stat_result) -> int:
    fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fout = os.open(name, flags, 0o600, dir_fd=dst)
        try:
            copied = 0
            while True:
                chunk = os.read(fin, 1 << 20)
                if not chunk:
                    break
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fout, view) :]
                copied += len(chunk)
            _keep_meta(fout, st)
            return copied
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def _keep_meta(fd: int, st: os.stat_result) -> None:
    os.fchown(fd, st.st_uid, st.st_gid)
    # No set-id bit survives a copy (the tmpfs is nosuid anyway; a copy must not need it to be).
    os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
