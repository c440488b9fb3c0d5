"""What runs inside a fake container (see ``fake_docker.py``): execs as scripted programs.

Each attached exec is the far end of a socket pair, written in docker's multiplexed stream
format: the agent (speaking the real protocol, with frames from ``agent/protocol.py``) or the
``docker exec`` fallback wrapper. A command's behaviour is chosen by its text.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.sandbox.agent.protocol import (
    PREFIX,
    PROTOCOL_VERSION,
    decode_header,
    decode_prefix,
    encode_frame,
)

STDOUT, STDERR = 1, 2
HANG = "hang"
"""The command never ends and the agent never answers about it (signals included)."""
IGNORE_TERM = "ignore-term"
"""The command ignores SIGTERM; SIGKILL ends it."""
DIE = "die"
"""The container dies under the command before it printed anything."""
PROC_LIMIT = "proc-limit"
"""The agent refuses the command: no process left (until leftovers are killed)."""
BACKGROUND = "background"
"""The command leaves one process running in the background (the agent counts it)."""
AGENT_COMMANDS = (HANG, IGNORE_TERM, DIE, PROC_LIMIT, BACKGROUND)


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


class ConnectFailed(Exception):
    """The agent could not connect to the server's socket (the real one exits with 3)."""


@dataclass(eq=False)
class FakeExec:
    id: str
    container: FakeContainer
    cmd: list[str]
    options: dict[str, Any]
    running: bool = False
    exit_code: int | None = None
    sock: socket.socket | None = None
    """The container's end of an attached exec."""
    channel: socket.socket | None = None
    """An agent's connection to the server's socket (``--connect``), when it made one."""
    signals: queue.Queue[str] = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None

    def finish(self, code: int) -> None:
        self.exit_code, self.running = code, False
        self.signals.put("GONE")  # wakes a program waiting for signals
        self.close()

    def close(self) -> None:
        for sock in (self.sock, self.channel):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def send(self, stream: int, data: bytes) -> bool:
        try:
            assert self.sock is not None
            self.sock.sendall(_frame(stream, data))
        except OSError:
            return False
        return True


@dataclass(eq=False)
class FakeContainer:
    id: str
    name: str
    spec: dict[str, Any]
    state: str = "created"
    processes: int = 0
    """Processes left running by commands (what the agent's ``procs`` reports)."""
    procs_asked: int = 0
    execs: list[FakeExec] = field(default_factory=list)
    die: Callable[[], bool] | None = None
    """The ``DIE`` command's death (set by the client that made it); False: not this time."""
    tunnel_envs: list[dict[str, str]] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))
    """The ``env`` of every ``tunnel_listen`` its agents were sent, in order."""
    slot_mounts: dict[str, str] = field(default_factory=dict)
    """Host directory -> what is mounted on it (the client's table: a warm pool's slots)."""
    moved: dict[str, str] = field(default_factory=dict)
    """A bind source renamed on the host since this container was made -> its new path: a bind
    mount follows its directory, not the path it was made from."""

    def workspace(self) -> str | None:
        """The host directory the container sees at /workspace, mounts on it followed."""
        for mount in (self.spec.get("host_config") or {}).get("mounts") or ():
            if mount.get("Target") == "/workspace":
                source = self.moved.get(str(mount["Source"]), str(mount["Source"]))
                return self.slot_mounts.get(source, source)
        return None

    @property
    def labels(self) -> dict[str, str]:
        labels: dict[str, str] = self.spec.get("labels") or {}
        return labels

    def summary(self) -> dict[str, Any]:
        """The form ``containers(all=True)`` lists."""
        return {
            "Id": self.id,
            "Names": [f"/{self.name}"],
            "Labels": dict(self.labels),
            "State": self.state,
            "Created": self.created,
            "Mounts": [
                {"Type": m.get("Type"), "Source": m.get("Source"), "Destination": m.get("Target")}
                for m in (self.spec.get("host_config") or {}).get("mounts") or ()
            ],
        }


def pidfile_of(ex: FakeExec) -> str | None:
    return ex.cmd[4] if ex.cmd[:2] == ["sh", "-c"] and len(ex.cmd) == 7 else None


class FakeAgent:
    """The in-container agent's side of the protocol, with scripted commands."""

    def __init__(self, ex: FakeExec) -> None:
        self.ex = ex
        self.sock = ex.sock
        assert self.sock is not None
        self.refused_once = False
        if "--connect" in ex.cmd:  # as the real agent: connect to the socket mounted there
            target = ex.cmd[ex.cmd.index("--connect") + 1]
            mounts = {m["Target"]: m["Source"] for m in ex.container.spec["host_config"]["mounts"]}
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(os.path.join(mounts[os.path.dirname(target)], os.path.basename(target)))
            except (KeyError, OSError) as exc:
                conn.close()
                ex.send(STDERR, f"agent: cannot connect to {target}: {exc}\n".encode())
                raise ConnectFailed from exc
            self.sock = ex.channel = conn

    def send(self, header: Mapping[str, Any], payload: bytes = b"") -> None:
        frame = encode_frame(header, payload)
        if self.sock is self.ex.sock:
            self.ex.send(STDOUT, frame)
            return
        assert self.sock is not None
        with contextlib.suppress(OSError):
            self.sock.sendall(frame)

    def _read(self, n: int) -> bytes:
        assert self.sock is not None
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def run(self) -> None:
        execs: dict[int, str] = {}
        try:
            while True:
                size, body = decode_prefix(self._read(PREFIX.size), max_header=1 << 20, max_payload=1 << 26)
                header = decode_header(self._read(size))
                if body:
                    self._read(body)
                rid, op = header["id"], header.get("op")
                if op == "ping":
                    self.send({"id": rid, "type": "result", "version": PROTOCOL_VERSION})
                elif op == "procs":
                    container = self.ex.container
                    container.procs_asked += 1
                    killed = container.processes if header.get("kill") else 0
                    container.processes -= killed
                    self.send(
                        {"id": rid, "type": "result", "processes": killed or container.processes}
                        | {"killed": killed, "left": container.processes}
                    )
                elif op == "exec":
                    execs[rid] = header["command"]
                    self._exec(rid, header["command"])
                elif op == "signal":
                    self._signal(execs.get(header["exec_id"]), header["exec_id"], header["signal"])
                    self.send({"id": rid, "type": "result", "delivered": True})
                elif op == "tunnel_listen":  # listens nowhere: the tests look at what it was told
                    self.ex.container.tunnel_envs.append(dict(header.get("env") or {}))
                    self.send({"id": rid, "type": "listening", "port": header["port"] or 3128})
                elif op == "exists" and header.get("path") == HANG:
                    pass  # a file operation the agent never answers
                elif op == "stat":
                    self._stat(rid, header["path"])
                elif op == "exists":
                    self.send({"id": rid, "type": "result", "exists": False})
                else:
                    self.send(
                        {"id": rid, "type": "error", "code": "bad_request", "message": f"unknown op {op}"}
                    )
        except EOFError:
            pass

    def _stat(self, rid: int, path: str) -> None:
        """Files only, as the container would see them at /workspace."""
        root = self.ex.container.workspace()
        if root is not None and os.path.isfile(os.path.join(root, path)):
            self.send(
                {
                    "id": rid,
                    "type": "result",
                    "path": path,
                    "kind": "file",
                    "size": 0,
                    "mode": 0o600,
                    "mtime": 0.0,
                }
            )
        else:
            self.send({"id": rid, "type": "error", "code": "ENOENT", "message": f"{path}: not found"})

    def _exec(self, rid: int, command: str) -> None:
        container = self.ex.container
        if command in (HANG, IGNORE_TERM):
            self.send({"id": rid, "type": "output", "stream": "stdout"}, b"started\n")
        elif command == DIE and container.die is not None and container.die():
            pass  # silent until the container is gone
        elif command == PROC_LIMIT and container.processes:
            self.send(
                {"id": rid, "type": "error", "code": "proc_limit", "message": "no process left"}
                | {"processes": container.processes}
            )
        else:
            if command == BACKGROUND:
                container.processes += 1
            self.send({"id": rid, "type": "output", "stream": "stdout"}, f"ran: {command}\n".encode())
            self.send({"id": rid, "type": "exit", "exit_code": 0, "signal": None})

    def _signal(self, command: str | None, rid: int, sig: str) -> None:
        if command == IGNORE_TERM and sig == "KILL":
            self.send({"id": rid, "type": "exit", "exit_code": None, "signal": 9})
        # HANG: the command and the agent both ignore it (what only the container's removal ends)


class FallbackCommand:
    """``docker exec sh -c WRAPPER`` for an image without the agent: scripted like the agent's."""

    def __init__(self, ex: FakeExec) -> None:
        self.ex = ex

    def run(self) -> None:
        command = self.ex.cmd[6]
        if command in (IGNORE_TERM, HANG):
            self.ex.send(STDOUT, b"started\n")
            while True:
                sig = self.ex.signals.get()
                if sig == "KILL" and command == IGNORE_TERM:
                    self.ex.finish(137)
                    return
                if not self.ex.running:
                    return
        self.ex.send(STDOUT, f"ran: {command}\n".encode())
        self.ex.send(STDERR, b"note\n")
        self.ex.finish(0)
