"""Looking into a runc container from the host, through ``/proc/<pid>/root`` of its init, without
following a link a sandbox could have planted: what a re-adopted container sees at its mounts, and
whether a file is there (``launch.py``'s checks of a container kept across a restart, with no
``docker exec``). runc shows the host's device and inode numbers, so what is read here is what
``stat`` in the container would say; gVisor does not, and is asked from inside instead.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.workspace_pin import WorkspaceRefused, open_pinned


def in_container(pid: int, container_id: str) -> bool:
    """Whether the process ``pid`` is in the container ``container_id``: in its cgroup (which no
    process in a container can leave) and in a pid namespace other than the server's."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            cgroups = f.read(1 << 16)
        own = os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False
    return own and len(container_id) == 64 and container_id in cgroups


def seen_from_host(pid: int, expected: list[tuple[str, int, int]], container_id: str | None = None) -> bool:
    """Whether the container whose init is ``pid`` has, at each ``(target, st_dev, st_ino)``, that
    very directory: walked from its root through ``/proc/<pid>/root`` without following a link
    (blocking). runc shows the host's numbers, so this is what ``stat`` in the container says.
    Given ``container_id``, ``pid`` must still be that container's once its root is pinned."""
    with _root(pid, container_id) as root:
        if root is None:
            return False
        for target, dev, ino in expected:
            fd = _walk(root, _parts(target))
            if fd is None:
                return False
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if (st.st_dev, st.st_ino) != (dev, ino):
                return False
        return True


def file_seen_from_host(pid: int, path: str, container_id: str | None = None) -> bool:
    """Whether the container whose init is ``pid`` has a regular file at ``path``, reached from
    its root without following a link (blocking; ``container_id`` as for ``seen_from_host``)."""
    *dirs, name = _parts(path)
    with _root(pid, container_id) as root:
        fd = _walk(root, dirs) if root is not None else None
        if fd is None:
            return False
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            return False
        finally:
            os.close(fd)


@contextlib.contextmanager
def _root(pid: int, container_id: str | None) -> Iterator[int | None]:
    """``pid``'s root directory, pinned (then checked to be ``container_id``'s, given one: a pid
    reused meanwhile is never looked into); None when it cannot be had."""
    try:
        root = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield root if container_id is None or in_container(pid, container_id) else None
    finally:
        os.close(root)


def _walk(root: int, parts: list[str]) -> int | None:
    """A directory fd for ``parts`` below ``root``, no link followed; None when there is none."""
    try:
        return open_pinned(root, parts, create=False, owner=None, what="re-adoption")
    except (WorkspaceRefused, SandboxError):
        return None


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]
