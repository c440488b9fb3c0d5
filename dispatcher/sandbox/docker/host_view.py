"""Looking into a runc container from the host, through ``/proc/<pid>/root`` of its init, without
following a link a sandbox could have planted: what a re-adopted container sees at its mounts, and
whether a file is there (``launch.py``'s checks of a container kept across a restart, with no
``docker exec``). runc shows the host's device and inode numbers, so what is read here is what
``stat`` in the container would say; gVisor does not, and is asked from inside instead.
"""

from __future__ import annotations

import os
import stat

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.workspace_pin import WorkspaceRefused, open_pinned


def seen_from_host(pid: int, expected: list[tuple[str, int, int]]) -> bool:
    """Whether the container whose init is ``pid`` has, at each ``(target, st_dev, st_ino)``, that
    very directory: walked from its root through ``/proc/<pid>/root`` without following a link
    (blocking). runc shows the host's numbers, so this is what ``stat`` in the container says."""
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        for target, dev, ino in expected:
            try:
                fd = open_pinned(root, _parts(target), create=False, owner=None, what="re-adoption")
            except (WorkspaceRefused, SandboxError):
                return False
            if fd is None:
                return False
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if (st.st_dev, st.st_ino) != (dev, ino):
                return False
        return True
    finally:
        os.close(root)


def file_seen_from_host(pid: int, path: str) -> bool:
    """Whether the container whose init is ``pid`` has a regular file at ``path``, reached from
    its root without following a link (blocking)."""
    *dirs, name = _parts(path)
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fd = open_pinned(root, dirs, create=False, owner=None, what="re-adoption")
        except (WorkspaceRefused, SandboxError):
            return False
        if fd is None:
            return False
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            return False
        finally:
            os.close(fd)
    finally:
        os.close(root)


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]
