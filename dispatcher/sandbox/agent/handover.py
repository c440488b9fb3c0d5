"""Surviving the server: an agent whose channel ends keeps its process table and waits for the
agent the next server starts, which hands it its channel.

Why. A server that dies (``kill -9``) or restarts closes the agent's channel: the agent reads the
end of its stdin (or socket). A restarted server re-adopts the session's container and starts a
*new* agent in it (``docker exec``, ``adopt.py``); it cannot reach the old one, whose stdin was the
old server's stream. The process table must outlive that, and so must the processes: their
stdout and stderr are pipes the agent reads, and a pipe whose reader exits turns the process's
next write into ``EPIPE`` (a dev server's request log kills its handler). Keeping the output in
files on the container's tmpfs instead would not bound it (a ring cannot be kept in a file the
process appends to without the agent trimming it), and a separate supervisor process per
container would cost every session a second Python process (memory is the budget of idle
sessions). So the agent that owns the table simply stays: it is the parent of its processes
(their exit statuses are its to reap), it keeps draining their pipes into the rings while no
server is there, and a successor gives it the new channel.

How. When its channel ends cleanly in a sandbox container, the agent kills what the channel's requests were still running (their answers have nowhere to go),
ends the channel's watches, tunnels and transfers, and listens on an abstract unix socket named
after its uid and root (``waiting_name``), which it has held since it started (a successor that
connects before the old agent saw its channel end waits in the backlog, up to
``HANDOVER_SECONDS``). The container's network namespace is its own (``network_mode: none``), so
the name is private to the container and no file is left behind.
Every agent, before it serves, connects to that name; when a waiting agent answers, it sends it
its channel's descriptors (``SCM_RIGHTS``: stdin and stdout, or the server's socket, and stderr)
and who it is (protocol version, root, grants). The waiting agent takes them only if all of it
matches its own, and serves the protocol on them from then on: to the server it is the agent it
started, answering its first ping. The successor then only waits for the serving agent's end
(its connection closes when that process exits) and exits with it, so the exec the server
started lives exactly as long as the agent that answers on its channel.

The server itself. A restarted server on runc reaches the waiting agent without a successor (and
without the ``docker exec`` and Python start one costs: a thousand re-adoptions in seconds, not
minutes): from a thread it moves into the container's network namespace, it connects to the same
name and hands over a socket pair's end as the channel, exactly as a successor would
(``dispatcher/sandbox/docker/agent/rejoin.py``). Seen from the container, that peer has no pid
(``SO_PEERCRED`` gives 0 for a process outside the container's pid namespace) and is root: only the
host's root, which has entered the container's namespaces from outside, is such a peer; no process
in the container can be. The agent waits with an empty table too, so every re-adopted container
has an agent to rejoin.

Trust. Processes in the sandbox run as the agent's user and can connect to the name too: one that
hands the waiting agent a channel is served by an agent with its own rights over its own
workspace, which gains it nothing. One that takes the name first (or answers in place of a
waiting agent) can keep a new agent from being handed over, or receive its channel: both ends
check that the peer runs the agent's own program (``/proc/<pid>/exe`` and its interpreter's
arguments), and the server treats whatever arrives on the channel as untrusted, as always. If
there is no waiting agent, or it refuses, the new agent serves on its own, and the old one's
processes are what ``procs`` has always called what earlier agents left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
from dataclasses import dataclass
from typing import IO, Any

from .protocol import CHUNK, waiting_socket_name

HELLO_BYTES = 64 << 10
HANDOVER_SECONDS = 5.0
"""How long either side waits for the other's part of the hand-over."""
_TAKEN = b"taken"
_PEERCRED = struct.Struct("3i")


def waiting_name(root: str) -> str:
    """The abstract socket where an agent of this user and root waits for a successor."""
    return waiting_socket_name(os.getuid(), os.path.realpath(root))


def peer_pid(sock: socket.socket) -> int:
    """The pid of a unix socket's peer (``SO_PEERCRED``); 0 when it cannot be told."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return 0
    pid: int = _PEERCRED.unpack(raw)[0]
    return pid


def _from_host(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` is root from outside this process's pid namespace: the
    server, in the container's network namespace (see the module docstring)."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return False
    pid, uid, _ = _PEERCRED.unpack(raw)
    return bool(pid == 0 and uid == 0)


def _program(pid: int | str) -> tuple[str, list[bytes]] | None:
    """(executable, the interpreter's first arguments: its options and the agent's path) of a
    process; None when it cannot be told."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read(8192).split(b"\0")
    except OSError:
        return None
    return exe, argv[:3]


def _same_program(sock: socket.socket) -> bool:
    """Whether the peer of ``sock`` runs the same program as this process."""
    pid = peer_pid(sock)
    theirs = _program(pid) if pid else None
    return theirs is not None and theirs == _program("self")


@dataclass
class Channel:
    """A channel handed over by a successor: the protocol's streams and the successor's link."""

    inp: IO[bytes]
    out: IO[bytes]
    successor: socket.socket
    """Open while this agent serves: its end tells the successor (and so the server) that it ended."""
    pid: int
    """The successor's pid (spared by ``procs``: it stands for this agent)."""


class Successors:
    """Where an agent whose channel ended waits for the next one (see the module docstring)."""

    def __init__(self, name: str, identity: dict[str, Any], *, adopt_stderr: bool = True) -> None:
        """Take the name now, while this agent serves: a successor that comes before this agent
        has seen its channel end waits in the backlog instead of finding nobody."""
        self._identity = identity
        self._adopt_stderr = adopt_stderr
        """Point this process's stdout and stderr at the successor's stderr (off in tests, which
        run the agent inside the test process)."""
        self._sock: socket.socket | None = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(name)
            sock.listen(4)
        except OSError as exc:
            print(f"agent: cannot wait for a successor at {name[1:]!r}: {exc}", file=sys.stderr)
            sock.close()
            return
        self._sock = sock

    def wait(self) -> Channel | None:
        """Block until a successor hands over its channel; None when the name could not be had."""
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return None
            channel = self._take(conn)
            if channel is not None:
                return channel
        return None

    def close(self) -> None:
        """Let go of the name (this agent ends)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _take(self, conn: socket.socket) -> Channel | None:
        fds: list[int] = []
        try:
            conn.settimeout(HANDOVER_SECONDS)
            if not (_from_host(conn) or _same_program(conn)):
                raise OSError("the peer is neither an agent nor the server")
            data, fds, _, _ = socket.recv_fds(conn, HELLO_BYTES, 4)
            if json.loads(data.decode("utf-8")) != self._identity or len(fds) != 3:
                raise OSError("the successor is another agent (version, root or grants)")
            conn.sendall(_TAKEN)
            conn.settimeout(None)
        except (OSError, ValueError) as exc:
            print(f"agent: refused a hand-over: {exc}", file=sys.stderr)
            for fd in fds:
                os.close(fd)
            conn.close()
            return None
        inp_fd, out_fd, err_fd = fds
        if self._adopt_stderr:  # diagnostics go where the successor's go
            for target in (1, 2):
                os.dup2(err_fd, target)
        os.close(err_fd)
        inp = os.fdopen(inp_fd, "rb", buffering=CHUNK)
        out = os.fdopen(out_fd, "wb", buffering=CHUNK)
        return Channel(inp, out, conn, peer_pid(conn))


def hand_over(name: str, identity: dict[str, Any], inp: int, out: int) -> socket.socket | None:
    """Give the channel (``inp``, ``out``, and this process's stderr) to the agent waiting at
    ``name``; its link (open while that agent lives), or None when none took it."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(HANDOVER_SECONDS)
        sock.connect(name)
        if not _same_program(sock):
            raise OSError("the waiting peer is not an agent")
        socket.send_fds(sock, [json.dumps(identity).encode("utf-8")], [inp, out, 2])
        answer = sock.recv(len(_TAKEN))
    except OSError:
        sock.close()
        return None
    if answer != _TAKEN:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def follow(link: socket.socket) -> int:
    """Wait (the successor's whole life after a hand-over) until the serving agent ends."""
    with link, contextlib.suppress(OSError):
        while link.recv(4096):
            pass
    return 0
