"""One process of the table: its record, pipes and output ring, and the signals that reach its
group (``table.py`` owns every instance and its lock)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time

from .process_messages import ProcInfo
from .ring import Ring

SIGNALS = {
    "TERM": signal.SIGTERM,
    "KILL": signal.SIGKILL,
    "INT": signal.SIGINT,
    "HUP": signal.SIGHUP,
    "QUIT": signal.SIGQUIT,
    "USR1": signal.SIGUSR1,
    "USR2": signal.SIGUSR2,
}
ENDING = {signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
"""Signals after which a process that ends counts as ``killed``."""


class Process:
    """One process's record, pipes and output; its fields change under the table's lock."""

    def __init__(self, process_id: str, command: str, cwd: str, ring: int, lock: threading.Lock) -> None:
        self.process_id = process_id
        self.command = command
        self.cwd = cwd
        self.ring = Ring(ring)
        self.cond = threading.Condition(lock)
        self.popen: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.origin = "background"
        self.tool_use_id: str | None = None
        self.started = time.time()
        self.ended: float | None = None
        self.state = "running"
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.stopping = False  # an ending signal was sent: the end is a kill
        self.outputs: dict[int, str] = {}  # open output fds -> their stream
        self.stdin: int | None = None
        self.pending = bytearray()  # stdin bytes the process has not taken yet
        self.close_stdin = False
        self.pidfd: int | None = None

    def info(self) -> ProcInfo:
        return ProcInfo(
            self.process_id,
            self.command,
            self.cwd,
            self.pid,
            self.state,
            self.exit_code,
            self.signal,
            self.started,
            self.ended,
            self.tool_use_id,
            self.ring.end,
            self.ring.first,
            self.ring.capacity,
            self.stdin is not None and not self.close_stdin,
            self.origin,
        )


def killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs: zombies (dead, waiting for init to reap
    them) do not count, whatever ``killpg`` says of them."""
    if not killpg(pgid, 0):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()  # state, ppid, pgrp
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] not in (b"Z", b"X"):
            return True
    return False


def new_process_id() -> str:
    """An id for a process the host did not name (what an exec left running, say)."""
    return "p_" + secrets.token_hex(6)
