"""Which process opened a loopback connection: the socket's inode from ``/proc/net/tcp`` (or
``tcp6``), then the process holding that inode among its descriptors (``/proc/<pid>/fd``).

The agent tells the host which command's process opened each proxy connection, so that a question
about an unlisted host lands on the call that ran ``pip``. A process of another user, a race with
the process exiting, or a ``/proc`` without these files (some runtimes) give None: the host then
falls back to the session's only running call. Nothing here is trusted for security: it only
decides where a confirmation request is shown and which call's cancel closes the tunnel.
"""

from __future__ import annotations

import os
import socket

MAX_PIDS = 4096
"""Processes looked through for one connection; a sandbox has a pids limit far below this."""


def _hex_endpoint(address: str, port: int, family: int) -> str | None:
    """``ADDR:PORT`` as ``/proc/net/tcp`` writes it (the address in host byte order, per 32 bits)."""
    try:
        packed = socket.inet_pton(family, address)
    except OSError:
        return None
    words = [packed[i : i + 4][::-1].hex().upper() for i in range(0, len(packed), 4)]
    return f"{''.join(words)}:{port:04X}"


def socket_inode(local: tuple[str, int], remote: tuple[str, int], family: int) -> int | None:
    """The inode of the socket whose local end is ``local`` and remote end ``remote``."""
    want_local = _hex_endpoint(local[0], local[1], family)
    want_remote = _hex_endpoint(remote[0], remote[1], family)
    table = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        with open(table, encoding="ascii", errors="replace") as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) > 9 and fields[1] == want_local and fields[2] == want_remote:
                    inode = int(fields[9])
                    return inode or None
    except (OSError, ValueError):
        return None
    return None


def pid_of_inode(inode: int, skip: int) -> int | None:
    """A process (not ``skip``) that holds socket ``inode`` open."""
    target = f"socket:[{inode}]"
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names[:MAX_PIDS]:
        if not name.isdigit() or int(name) == skip:
            continue
        fd_dir = f"/proc/{name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    return int(name)
            except OSError:
                continue
    return None


def peer_pid(sock: socket.socket) -> int | None:
    """The process at the other end of an accepted loopback connection, when ``/proc`` tells."""
    try:
        ours = sock.getsockname()[:2]
        theirs = sock.getpeername()[:2]
    except OSError:
        return None
    # The peer's socket has our ends swapped: its local end is our remote one.
    inode = socket_inode(theirs, ours, sock.family)
    return pid_of_inode(inode, os.getpid()) if inode is not None else None


def ancestry(pid: int, depth: int = 64) -> list[tuple[int, int, int]]:
    """(pid, process group, session) of ``pid`` and its ancestors, nearest first."""
    out: list[tuple[int, int, int]] = []
    while pid > 1 and len(out) < depth:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                raw = f.read()
            fields = raw[raw.rfind(b")") + 2 :].split()  # state, ppid, pgrp, session
            ppid, pgrp, session = int(fields[1]), int(fields[2]), int(fields[3])
        except (OSError, ValueError, IndexError):
            break
        out.append((pid, pgrp, session))
        pid = ppid
    return out
