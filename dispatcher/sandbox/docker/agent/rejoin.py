"""Re-joining the agent that waits in a re-adopted runc container, without a ``docker exec``.

An agent whose channel ends (the server died or stopped) waits at an abstract unix socket for the
next channel (``dispatcher/sandbox/agent/handover.py``). A restarted server used to reach it only
through a successor: a new agent started with ``docker exec``, which connects and hands over its
channel. That exec, its runc and a Python start cost about 100 ms of CPU per container, so a
thousand sessions took minutes to answer after a restart. Instead, the server hands the waiting
agent a channel itself:

1. The container's init pid comes from the daemon (``inspect``); the process must be in the
   container's cgroup and in a pid namespace other than the server's, checked after its network
   namespace is held open (a pid reused meanwhile is never entered). A thread of its own moves into
   that namespace (``setns``), makes one unix socket there, and moves back: an
   abstract name belongs to a network namespace, and a socket keeps the namespace it was made in.
   The thread does nothing else, and ends with the call, so no other work ever runs in a
   sandbox's namespace.
2. It connects to the name the agent waits at (its uid and root), with a short timeout.
3. The peer must be the agent: its pid (``SO_PEERCRED``, in the host's pid namespace, which no
   process in the container can choose) is in the container's pid namespace, runs as the
   session's uid, and its command line starts as the server starts the agent. A process of the
   sandbox that took the name first can pass only by running the agent itself, as the sandbox
   user, which gains it nothing: the channel is untrusted as always.
4. The server sends what a successor sends: who the agent must be (protocol version, root,
   grants), the channel (one end of a socket pair, as stdin and stdout) and a pipe for the
   agent's stderr; the agent answers ``taken`` and serves on the pair from then on.

The agent accepts the server because, seen from the container, its peer is root with no pid: a
process outside the container's pid namespace, which only the host's root can be. Anything that
goes wrong (no waiting agent, an older one, a refusal, a timeout, gVisor, a server without root)
returns None and the caller starts a new agent as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from dispatcher.sandbox.agent.protocol import handover_identity, parse_grants, waiting_socket_name
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.docker.host_view import in_container
from dispatcher.sandbox.docker.stream import READER_LIMIT, STDERR_TAIL_BYTES

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_SECONDS = 2.0
"""How long the hand-over may take (an agent answers in a millisecond; one that does not is not
waited for: a new agent is started instead)."""
_CLONE_NEWNET = 0x40000000
_TAKEN = b"taken"
_HELLO_BYTES = 64 << 10
_PEERCRED = struct.Struct("3i")


class RejoinRefused(OSError):
    """No waiting agent could be given the channel (the message says why)."""


@dataclass
class Joined:
    """The blocking part's result: the channel's end, the agent's link, its stderr, its pid."""

    channel: socket.socket
    link: socket.socket
    stderr: int
    pid: int


def identity(grant_args: list[str]) -> dict[str, object]:
    """Who the waiting agent must be, as it compares it: its protocol version, root and grants, as
    the agent parses them from the arguments the server starts it with (``agent_grant_args``)."""
    grants = parse_grants(grant_args[1]) if grant_args[:1] == ["--grants"] else None
    return handover_identity(WORKSPACE_ROOT, grants)


def numeric_uid(user: str) -> int | None:
    """The uid of a ``uid[:gid]`` user; None for a user name (its agent is not rejoined)."""
    uid = user.partition(":")[0]
    return int(uid) if uid.isdigit() else None


def _setns(fd: int) -> None:
    setns = getattr(os, "setns", None)  # Python >= 3.12
    if setns is not None:
        setns(fd, _CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def socket_in_netns(pid: int, container_id: str) -> socket.socket:
    """A unix stream socket made in the network namespace of ``pid``, the init of the container
    ``container_id`` (blocking; run it on a thread of its own: ``_on_own_thread``). The namespace
    is held open before ``pid`` is checked, so a pid reused in between is never entered.

    Raises:
        OSError: the namespace cannot be entered (no such process, not root, not the container's),
            or left again.
    """
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        theirs = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if not in_container(pid, container_id):
                raise RejoinRefused(f"pid {pid} is not the container's")
            _setns(theirs)
        finally:
            os.close(theirs)
        try:
            return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        finally:
            _setns(own)  # if this raised, the thread ends here, never reused (``_on_own_thread``)
    finally:
        os.close(own)


async def _on_own_thread(fn: Callable[[], T], discard: Callable[[T], None]) -> T:
    """``fn()`` on a new thread that ends with it (never one of the event loop's executor's); a
    result that comes after the caller was cancelled is given to ``discard``."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            if result is not None:
                discard(result)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the awaiting task
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="agent-rejoin", daemon=True).start()
    return await future


def _peer(sock: socket.socket) -> tuple[int, int]:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, _ = _PEERCRED.unpack(raw)
    return pid, uid


def check_peer(sock: socket.socket, init_pid: int, uid: int, argv_head: list[str]) -> int:
    """The peer's pid, once it is shown to be the container's agent (see the module docstring).

    Raises:
        RejoinRefused: it is not.
    """
    pid, peer_uid = _peer(sock)
    if pid <= 0:
        raise RejoinRefused("the waiting peer's pid cannot be told")
    try:
        same_ns = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{init_pid}/ns/pid")
        same_ns = same_ns and os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(8192).split(b"\0")
    except OSError as exc:
        raise RejoinRefused(f"the waiting peer cannot be read: {exc.strerror}") from None
    if not same_ns:
        raise RejoinRefused("the waiting peer is not in the container")
    if peer_uid != uid:
        raise RejoinRefused(f"the waiting peer runs as uid {peer_uid}, not {uid}")
    if argv[: len(argv_head)] != [os.fsencode(a) for a in argv_head]:
        raise RejoinRefused("the waiting peer is not the agent")
    return pid


def join(container_id: str, init_pid: int, uid: int, argv_head: list[str], who: dict[str, object]) -> Joined:
    """Hand a new channel to the agent waiting in the container ``container_id``, whose init is
    ``init_pid`` (blocking; on a thread of its own, as ``socket_in_netns`` runs).

    Raises:
        OSError: no agent waits there, or it refused (``RejoinRefused``).
    """
    sock = socket_in_netns(init_pid, container_id)
    ours: socket.socket | None = None
    err_r = -1
    try:
        sock.settimeout(CONNECT_SECONDS)
        sock.connect(waiting_socket_name(uid, WORKSPACE_ROOT))
        pid = check_peer(sock, init_pid, uid, argv_head)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            socket.send_fds(
                sock, [json.dumps(who).encode("utf-8")], [theirs.fileno(), theirs.fileno(), err_w]
            )
        finally:
            theirs.close()
            os.close(err_w)
        answer = sock.recv(len(_TAKEN))
        if answer != _TAKEN:
            raise RejoinRefused("the waiting agent refused the channel (another version, root or grants)")
        sock.settimeout(None)
    except BaseException:
        sock.close()
        if ours is not None:
            ours.close()
        if err_r >= 0:
            os.close(err_r)
        raise
    return Joined(ours, sock, err_r, pid)


def _close(joined: Joined) -> None:
    """Let go of a channel nobody will use: the agent sees it end and waits again."""
    joined.channel.close()
    joined.link.close()
    os.close(joined.stderr)


class _StderrTail(asyncio.Protocol):
    """The agent's stderr, kept as a bounded tail for diagnostics (``AgentStream.stderr_tail``)."""

    def __init__(self) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        while self._size > STDERR_TAIL_BYTES and len(self._chunks) > 1:
            self._size -= len(self._chunks.popleft())

    def tail(self) -> bytes:
        return b"".join(self._chunks)[-STDERR_TAIL_BYTES:]


class RejoinedStream:
    """An ``AgentStream`` for a rejoined agent: the socket pair's end it speaks on, the link that
    stays open while it lives, and its stderr."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: socket.socket,
        stderr: asyncio.ReadTransport,
        tail: _StderrTail,
        pid: int,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self._link = link
        self._stderr = stderr
        self._tail = tail
        self.pid = pid

    @property
    def closed(self) -> bool:
        """The agent's channel ended (it exited, or the server closed it)."""
        return self.reader.at_eof() or self.writer.is_closing()

    def stderr_tail(self) -> bytes:
        return self._tail.tail()

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
        self._stderr.close()
        self._link.close()


async def rejoin(
    container_id: str, init_pid: int, user: str, argv_head: list[str], grant_args: list[str]
) -> tuple[RejoinedStream, AgentChannel] | None:
    """The channel to the agent waiting in the container ``container_id`` whose init is
    ``init_pid``, unpinged; None when there is none to rejoin (the caller starts one)."""
    uid = numeric_uid(user)
    if uid is None or os.geteuid() != 0:
        return None
    who = identity(grant_args)
    try:
        joined = await _on_own_thread(lambda: join(container_id, init_pid, uid, argv_head, who), _close)
    except OSError as exc:
        log.debug("no agent to rejoin in the container of pid %d: %s", init_pid, exc)
        return None
    loop = asyncio.get_running_loop()
    try:
        joined.channel.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=joined.channel, limit=READER_LIMIT)
    except BaseException:
        _close(joined)
        raise
    tail = _StderrTail()
    pipe = os.fdopen(joined.stderr, "rb", buffering=0)
    try:
        stderr, _ = await loop.connect_read_pipe(lambda: tail, pipe)
    except BaseException:
        pipe.close()
        writer.close()
        joined.link.close()
        raise
    with contextlib.suppress(OSError):
        joined.link.setblocking(False)
    stream = RejoinedStream(reader, writer, joined.link, stderr, tail, joined.pid)
    return stream, AgentChannel(reader, writer, workspace_root=WORKSPACE_ROOT)
