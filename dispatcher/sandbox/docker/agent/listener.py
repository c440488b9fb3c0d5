"""The agent's direct channel on runc: a unix socket the server listens on, mounted read-only into
the new container, so agent frames skip the Docker daemon and the shim that relay an attached
exec's stdio (a round trip of about 15 µs instead of 165 µs on this machine).

The shape, and why it keeps the isolation rules:

- The server *listens*; the agent connects. The server never opens a path inside the sandbox; the
  socket lives in a directory of its own (``<state>/run/agent/<random>/``, the parent private to
  the server), bound through the directory's descriptor, so no path a sandbox controls is followed.
- The directory is mounted read-only at ``SOCKET_DIR``: nothing in the container can replace or add
  anything there. The socket exists only while an agent starts (it is removed once one is
  accepted); the directory lives as long as its container (named by its ``LABEL_AGENT_LINK``), so
  the agent a restarted server starts in a re-adopted container connects the same way.
- Only the process the server started is accepted: the peer's pid (``SO_PEERCRED``, in the host's
  pid namespace, which no process in the container can choose) must be the exec's pid as the
  daemon reports it. Anything else that connects (a process left running in a re-adopted
  container) is closed and logged; the pid is asked of the daemon once, then compared locally.
- gVisor cannot reach a host socket; there, and on Kubernetes, the agent is attached through the
  daemon as before (``attach.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

LABEL_AGENT_LINK = "dispatcher.agent-link"
"""The container label naming its listener directory (under the server's ``AgentSockets.root``)."""
SOCKET_DIR = "/opt/dispatcher/link"
"""Where a container sees its listener's directory (read-only)."""
SOCKET_NAME = "agent.sock"
SOCKET_BYTES = 1 << 20
"""The send and receive buffers asked for the server's end (the kernel caps them)."""
_PEERCRED = struct.Struct("3i")
_NAME = re.compile(r"[0-9a-f]{16}")


class AgentListener:
    """The socket in one container's directory, until an agent connects (the directory stays)."""

    def __init__(self, root_fd: int, name: str, directory: str) -> None:
        self._root_fd = root_fd
        self.name = name
        """The directory's name (the container's ``LABEL_AGENT_LINK``)."""
        self.source = directory
        """The directory on the host (mounted into the container)."""
        self._sock: socket.socket | None = None
        dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
        try:
            self._sock = sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with contextlib.suppress(FileNotFoundError):  # left by a server that died meanwhile
                os.unlink(SOCKET_NAME, dir_fd=dir_fd)
            # Through the directory's descriptor: short whatever the state dir's path, and no
            # component of it is looked up again.
            sock.bind(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
            os.chmod(SOCKET_NAME, 0o666, dir_fd=dir_fd, follow_symlinks=False)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(dir_fd)
        sock.listen(4)
        sock.setblocking(False)

    @property
    def mount(self) -> dict[str, Any]:
        """The container's mount of the directory."""
        return {
            "Type": "bind",
            "Source": self.source,
            "Target": SOCKET_DIR,
            "ReadOnly": True,
            "BindOptions": {"Propagation": "rprivate"},
        }

    @property
    def target(self) -> str:
        """The socket's path inside the container."""
        return f"{SOCKET_DIR}/{SOCKET_NAME}"

    async def accept(
        self, pid: Callable[[], Awaitable[int]], ended: asyncio.Future[Any]
    ) -> socket.socket | None:
        """The connection of the process whose pid (host pid namespace) ``pid()`` tells, asked
        when a peer has connected (0: it has not started); None once ``ended`` is done first
        (the process exited without connecting). Other peers are closed. The listener is closed
        either way.
        """
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        refused = 0
        try:
            while True:
                accepting = asyncio.ensure_future(loop.sock_accept(self._sock))
                either: set[asyncio.Future[Any]] = {accepting, ended}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not accepting.done():
                    accepting.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await accepting
                    if accepting.cancelled() or accepting.exception() is not None:
                        return None
                conn, _ = accepting.result()
                try:
                    peer = peer_pid(conn)
                    expected = await pid()
                except BaseException:  # the daemon failed, or the start was cancelled meanwhile
                    conn.close()
                    raise
                if peer == expected and expected > 0:
                    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                        with contextlib.suppress(OSError):
                            conn.setsockopt(socket.SOL_SOCKET, option, SOCKET_BYTES)
                    return conn
                if not refused:  # one line, however often a process retries
                    log.warning(
                        "closed a connection to the agent socket from pid %s (expected the agent, pid %s)",
                        peer,
                        expected,
                    )
                refused += 1
                conn.close()
        finally:
            self.close()
            if refused > 1:
                log.warning("closed %d connections to the agent socket in all", refused)

    def close(self) -> None:
        """Stop listening and remove the socket (idempotent); the directory is its container's."""
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        with contextlib.suppress(OSError):
            _empty(self._root_fd, self.name)


def peer_pid(conn: socket.socket) -> int:
    """The connected peer's pid as this process's pid namespace sees it (0: unknown)."""
    try:
        raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return 0
    pid: int = _PEERCRED.unpack(raw)[0]
    return pid


def _empty(root_fd: int, name: str) -> None:
    dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=root_fd)
    try:
        for entry in os.listdir(dir_fd):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


class AgentSockets:
    """Makes listeners under ``root`` (a directory only the server may enter), one directory per
    container, removed with it (``forget``) or, after a crash, by the next start (``sweep``)."""

    def __init__(self, root: str, *, enabled: bool = True) -> None:
        self.root = root
        self._root_fd: int | None = None
        self.usable = enabled
        """False when turned off, or once an agent could not connect (gVisor as the daemon's
        default runtime, an image whose agent predates ``--connect``): agents are attached
        through the daemon. Directories are still removed with their containers."""
        self._names: dict[str, str] = {}
        """Container id -> its directory's name, for the containers this server knows."""

    def _open_root(self) -> int:
        if self._root_fd is None:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
                os.fchmod(fd, 0o700)  # ours to fix; one another user owns is refused below
            if os.fstat(fd).st_uid != os.geteuid():
                os.close(fd)
                raise OSError(f"{self.root} belongs to another user")
            self._root_fd = fd
        return self._root_fd

    def listen(self) -> AgentListener:
        """A listener in a new directory, for a container about to be made (blocking: a few
        syscalls). Tell ``made`` the container's id once it exists.

        Raises:
            OSError: the directory or the socket could not be made.
        """
        root_fd = self._open_root()
        name = secrets.token_hex(8)
        os.mkdir(name, 0o711, dir_fd=root_fd)
        os.chmod(name, 0o711, dir_fd=root_fd, follow_symlinks=False)  # whatever the umask
        try:
            return AgentListener(root_fd, name, os.path.join(self.root, name))
        except BaseException:
            os.rmdir(name, dir_fd=root_fd)
            raise

    def known(self, container_id: str, name: str | None) -> None:
        """A container a previous run made is kept (the start-up sweep): ``name`` is its
        ``LABEL_AGENT_LINK`` (None: it has none), which only the server sets."""
        if name is not None and _NAME.fullmatch(name):
            self._names[container_id] = name

    def relisten(self, container_id: str) -> AgentListener | None:
        """A listener in the directory of a running container (re-adopted after a restart); None
        when it has none (made without one) or the directory is gone."""
        name = self._names.get(container_id)
        if not self.usable or name is None:
            return None
        try:
            return AgentListener(self._open_root(), name, os.path.join(self.root, name))
        except OSError:
            return None

    def made(self, container_id: str, listener: AgentListener) -> None:
        """``listener``'s directory is ``container_id``'s: removed with it (``forget``)."""
        self._names[container_id] = listener.name

    def forget(self, container_id: str) -> None:
        """The container is removed: remove its directory (blocking; a few syscalls)."""
        name = self._names.pop(container_id, None)
        if name is not None and self._root_fd is not None:
            with contextlib.suppress(OSError):
                _empty(self._root_fd, name)
                os.rmdir(name, dir_fd=self._root_fd)

    def discard(self, listener: AgentListener) -> None:
        """A listener whose container was never made (or is removed already): its directory too."""
        listener.close()
        if self._root_fd is not None:
            with contextlib.suppress(OSError):
                os.rmdir(listener.name, dir_fd=self._root_fd)

    def sweep(self) -> None:
        """Remove every directory no container this server knows names (``made``, ``known``):
        what containers removed while no server ran left."""
        kept = set(self._names.values())
        if self._root_fd is None and not os.path.isdir(self.root):
            return  # nothing was ever made here
        try:
            root_fd = self._open_root()
            names = os.listdir(root_fd)
        except OSError:
            return
        for name in names:
            if name in kept:
                continue
            with contextlib.suppress(OSError):
                _empty(root_fd, name)
                os.rmdir(name, dir_fd=root_fd)

    def close(self) -> None:
        if self._root_fd is not None:
            os.close(self._root_fd)
            self._root_fd = None
        with contextlib.suppress(OSError):
            os.rmdir(self.root)  # only when empty
