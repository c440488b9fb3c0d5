"""The process table: one agent's (one session's) background processes, by the host's ids.

Each process runs ``sh -c`` in its own process group (``start_new_session``), with pipes for its
stdin, stdout and stderr. One pump thread serves every process with a selector: it drains the
output pipes into each process's ring (``ring.py``) the moment bytes arrive, whoever reads them,
so a process is never slowed by a missing reader and nothing within the ring is dropped; it feeds
stdin from a bounded buffer without ever blocking; and it notices the end. A process has ended
when its output pipes are closed, its leader (the agent's child) is reaped, and its group is
empty: a child left in the background keeps it ``running``. Readers wait on a condition variable
(no thread spins); a watch is a thread that sends frames as the ring grows.

An exec's command that leaves processes holding its pipes (``cmd &``, ``nohup cmd &``) hands
them here (``adopt``): they are read on, listed and stopped like any other; their leader was the
exec's shell, already reaped, so their end has no exit status. A group that let go of the pipes
(``cmd >log 2>&1 &``, a daemon) is not taken: it is what ``procs`` counts and kills, as before
(taking it too made the pids-limit recovery of ``test_docker_process_limit`` flaky, for reasons
not yet understood; see the report of the change).

Bounds, each with its own error: running processes (``too_many``), a ring's size and all rings'
together, finished processes kept (the oldest is forgotten), stdin bytes buffered per process
(``too_large``).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .process import ENDING, SIGNALS, Process, group_alive, killpg
from .process_messages import ProcChunk, ProcData, ProcInfo, ProcOutput, ProcRead, ProcWatch
from .protocol import CHUNK, Done, Send
from .workspace import OpError

POLL_SECONDS = 0.1
"""How often the pump looks for an end it cannot be woken for: a group that outlives its pipes,
or a leader's exit where there is no pidfd (gVisor, an old kernel)."""
KILL_WAIT_SECONDS = 2.0
"""After ``SIGKILL``, how long a stop waits for the group to empty before answering."""


@dataclass(frozen=True)
class Limits:
    """The table's bounds (``--process-limits`` may change them)."""

    running: int = 32
    """Processes running at once."""
    ring_bytes: int = 1 << 20
    """A process's output ring when its start does not say."""
    max_ring_bytes: int = 16 << 20
    """The largest ring a start may ask for."""
    total_ring_bytes: int = 64 << 20
    """All rings of the table together, the finished processes' included."""
    finished: int = 64
    """Finished processes kept readable; the oldest is forgotten first."""
    stdin_bytes: int = 1 << 20
    """Bytes waiting for a process to read its stdin."""


class ProcessTable:
    """The background processes of one agent, and the pump thread that serves their pipes."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._lock = threading.Lock()
        self._procs: dict[str, Process] = {}  # in start order
        self._watches: set[int] = set()  # request ids of the running watches
        self._inbox: deque[Callable[[], None]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._stopped = False
        # Started now, while pids are free (as the agent's workers are).
        self._thread = threading.Thread(target=self._pump, name="process-pump", daemon=True)
        self._thread.start()

    # -- starting ----------------------------------------------------------------------------

    def start(
        self,
        process_id: str,
        command: str,
        *,
        cwd: str,
        shown_cwd: str,
        env: dict[str, str],
        tool_use_id: str | None,
        ring_bytes: int | None,
    ) -> ProcInfo:
        """Start ``sh -c command`` in ``cwd`` (``shown_cwd`` is what the record says), or answer
        the running record of the same id and command (a retried start).

        Raises:
            OpError: ``conflict``, ``too_many``, ``too_large``, or the start failed.
        """
        with self._lock:
            known = self._procs.get(process_id)
            if known is not None:
                if known.command != command:
                    raise OpError("conflict", f"process {process_id} exists and runs another command")
                return known.info()
            proc = self._reserve(process_id, command, shown_cwd, ring_bytes)
            proc.tool_use_id = tool_use_id
        try:
            self._spawn(proc, command, cwd, env)
        except BaseException:
            with self._lock:
                self._procs.pop(process_id, None)
            raise
        self._post(lambda: self._watch_fds(proc))
        with self._lock:
            return proc.info()

    def _reserve(self, process_id: str, command: str, cwd: str, ring_bytes: int | None) -> Process:
        """A new record, within the bounds (the lock is held)."""
        limits = self.limits
        running = sum(1 for p in self._procs.values() if p.state == "running")
        if running >= limits.running:
            raise OpError("too_many", f"{running} processes are running, the most a session may run")
        ring = limits.ring_bytes if ring_bytes is None else ring_bytes
        if ring > limits.max_ring_bytes:
            raise OpError("too_large", f"an output ring of {ring} bytes is more than {limits.max_ring_bytes}")
        while self._ring_total() + ring > limits.total_ring_bytes and self._forget_oldest():
            pass
        if self._ring_total() + ring > limits.total_ring_bytes:
            raise OpError(
                "too_large",
                f"the session's output rings would pass {limits.total_ring_bytes} bytes; stop a process",
            )
        proc = Process(process_id, command, cwd, ring, self._lock)
        self._procs[process_id] = proc
        return proc

    def _ring_total(self) -> int:
        return sum(p.ring.capacity for p in self._procs.values())

    def _forget_oldest(self) -> bool:
        for key, proc in self._procs.items():
            if proc.state != "running":
                del self._procs[key]
                return True
        return False

    def _spawn(self, proc: Process, command: str, cwd: str, env: dict[str, str]) -> None:
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            popen = subprocess.Popen(
                ["/bin/sh", "-c", command],
                cwd=cwd,
                env=env,
                stdin=stdin_r,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,  # its own group: signals reach every child
                close_fds=True,
            )
        except BaseException:
            for fd in (stdin_w, out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, out_w, err_w):
                os.close(fd)
        for fd in (stdin_w, out_r, err_r):
            os.set_blocking(fd, False)
        with self._lock:
            proc.popen, proc.pid = popen, popen.pid
            proc.outputs = {out_r: "stdout", err_r: "stderr"}
            proc.stdin = stdin_w
            with contextlib.suppress(OSError, AttributeError):
                proc.pidfd = os.pidfd_open(popen.pid)

    def adopt(self, process_id: str, command: str, cwd: str, pgid: int, outputs: dict[int, str]) -> bool:
        """Take over what an exec left running: its group ``pgid`` and the output pipes it holds
        (``outputs``, fd -> stream). False when the table is full (nothing is taken)."""
        with self._lock:
            if process_id in self._procs:
                return False
            try:
                proc = self._reserve(process_id, command, cwd, None)
            except OpError:
                return False
            proc.origin, proc.pid, proc.outputs = "left", pgid, dict(outputs)
        for fd in outputs:
            os.set_blocking(fd, False)
        self._post(lambda: self._watch_fds(proc))
        return True

    # -- the pump thread ---------------------------------------------------------------------

    def _post(self, job: Callable[[], None]) -> None:
        self._inbox.append(job)
        with contextlib.suppress(OSError):  # full: a wake-up is pending already
            self._wake_w.send(b"\0")

    def _watch_fds(self, proc: Process) -> None:
        for fd, stream in proc.outputs.items():
            self._sel.register(fd, selectors.EVENT_READ, (proc, stream))
        if proc.pidfd is not None:
            self._sel.register(proc.pidfd, selectors.EVENT_READ, (proc, "exit"))
        self._feed_later(proc)
        self._settle(proc)

    def _feed_later(self, proc: Process) -> None:
        """Watch stdin for room while bytes wait for it, or close it once asked and empty."""
        fd = proc.stdin
        if fd is None:
            return
        with self._lock:
            waiting, closing = bool(proc.pending), proc.close_stdin or proc.state != "running"
        registered = fd in self._sel.get_map()
        if waiting and not registered:
            self._sel.register(fd, selectors.EVENT_WRITE, (proc, "stdin"))
        elif not waiting and registered:
            self._sel.unregister(fd)
        if not waiting and closing:
            self._close_stdin(proc)

    def _close_stdin(self, proc: Process) -> None:
        fd = proc.stdin
        if fd is None:
            return
        if fd in self._sel.get_map():
            self._sel.unregister(fd)
        os.close(fd)
        with self._lock:
            proc.stdin = None
            proc.pending.clear()

    def _pump(self) -> None:
        try:
            self._serve()
        finally:
            self._close()

    def _close(self) -> None:
        """After ``shutdown``: reap the killed leaders, close every descriptor."""
        with self._lock:
            procs = list(self._procs.values())
        deadline = time.monotonic() + KILL_WAIT_SECONDS / 2
        for proc in procs:
            if proc.popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(max(deadline - time.monotonic(), 0))
            for fd in [*proc.outputs, proc.stdin, proc.pidfd]:
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _serve(self) -> None:
        while not self._stopped:
            with self._lock:
                lingering = [p for p in self._procs.values() if p.state == "running" and self._polled(p)]
            for key, _ in self._sel.select(POLL_SECONDS if lingering else None):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                    while self._inbox:
                        self._inbox.popleft()()
                    continue
                if self._sel.get_map().get(key.fd) is not key:
                    continue  # closed by an earlier event of this round
                proc, what = key.data
                if what == "stdin":
                    self._feed(proc)
                elif what == "exit":
                    self._sel.unregister(key.fd)
                    self._settle(proc)
                else:
                    self._drain(proc, key.fd, what)
            for proc in lingering:
                self._settle(proc)

    def _polled(self, proc: Process) -> bool:
        """Whether the end of ``proc`` can only be found by looking (the lock is held)."""
        if proc.outputs:
            return False  # its pipes' end wakes the pump
        return proc.popen is None or proc.pidfd is None or proc.popen.returncode is not None

    def _drain(self, proc: Process, fd: int, stream: str) -> None:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        with self._lock:
            if data:
                proc.ring.append(stream, data)
                proc.cond.notify_all()
                return
        self._sel.unregister(fd)
        os.close(fd)
        with self._lock:
            proc.outputs.pop(fd, None)
        self._settle(proc)

    def _feed(self, proc: Process) -> None:
        fd = proc.stdin
        assert fd is not None
        with self._lock:
            data = bytes(proc.pending[:CHUNK])
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            return
        except OSError:  # the process closed its stdin: what waited is dropped
            self._close_stdin(proc)
            return
        with self._lock:
            del proc.pending[:written]
        self._feed_later(proc)

    def _settle(self, proc: Process) -> None:
        """Record the end of ``proc`` once its pipes are closed, its leader reaped and its group
        empty (pump thread only)."""
        with self._lock:
            if proc.state != "running" or proc.outputs:
                return
            if proc.popen is not None and proc.popen.poll() is None:
                return
            if group_alive(proc.pid):
                return  # a child still runs in the group
            code = proc.popen.returncode if proc.popen is not None else None
            proc.state = "killed" if proc.stopping else "exited"
            if code is not None:
                proc.exit_code, proc.signal = (code, None) if code >= 0 else (None, -code)
            proc.ended = time.time()
            proc.cond.notify_all()
            pidfd, proc.pidfd = proc.pidfd, None
            self._trim_finished()
        if pidfd is not None:
            if pidfd in self._sel.get_map():
                self._sel.unregister(pidfd)
            os.close(pidfd)
        self._close_stdin(proc)

    def _trim_finished(self) -> None:
        finished = [key for key, p in self._procs.items() if p.state != "running"]
        for key in finished[: max(len(finished) - self.limits.finished, 0)]:
            del self._procs[key]

    # -- the requests ------------------------------------------------------------------------

    def _get(self, process_id: str) -> Process:
        proc = self._procs.get(process_id)
        if proc is None:
            raise OpError("no_process", f"no process {process_id}")
        return proc

    def records(self) -> list[ProcInfo]:
        with self._lock:
            return [p.info() for p in self._procs.values()]

    def info(self, process_id: str) -> ProcInfo:
        with self._lock:
            return self._get(process_id).info()

    def read(self, request: ProcRead) -> ProcOutput:
        """Output after ``request.after``, waiting up to ``wait_seconds`` for some or the end."""
        deadline = time.monotonic() + request.wait_seconds
        with self._lock:
            proc = self._get(request.process_id)
            while True:
                pieces, next_cursor, lost = proc.ring.read(request.after, request.max_bytes)
                left = deadline - time.monotonic()
                if pieces or lost or proc.state != "running" or left <= 0:
                    break
                proc.cond.wait(left)
            chunks = tuple(ProcChunk(stream, cursor, data) for stream, cursor, data in pieces)
            return ProcOutput(chunks, next_cursor, lost, proc.state, proc.exit_code, proc.signal)

    def begin_watch(self, rid: int, process_id: str) -> None:
        """Register watch ``rid`` before it runs (an ``unwatch`` may come before its thread does).

        Raises:
            OpError: ``no_process``.
        """
        with self._lock:
            self._get(process_id)
            self._watches.add(rid)

    def watch(self, rid: int, request: ProcWatch, send: Send) -> ProcInfo | None:
        """Send the output from ``request.after`` as it comes, then answer the record once the
        process ended and all of it went out, or once ``unwatch`` ends it (None: nobody reads)."""
        position, owed = request.after, 0
        with self._lock:
            proc = self._get(request.process_id)
        try:
            while True:
                with self._lock:
                    while True:
                        pieces, position, lost = proc.ring.read(position, 4 * CHUNK)
                        owed += lost
                        done = proc.state != "running" and position >= proc.ring.end
                        if pieces or done or rid not in self._watches:
                            break
                        proc.cond.wait()
                    if not pieces and (done or rid not in self._watches):
                        return proc.info()
                for stream, cursor, data in pieces:
                    for at in range(0, len(data), CHUNK):
                        frame = ProcData(stream, cursor + at, data[at : at + CHUNK], owed)
                        owed = 0
                        if not send(rid, frame):
                            return None
        finally:
            with self._lock:
                self._watches.discard(rid)

    def unwatch(self, watch: int) -> Done:
        """End a watch (it answers with the record); done whether or not it still ran."""
        with self._lock:
            if watch in self._watches:
                self._watches.discard(watch)
                for proc in self._procs.values():
                    proc.cond.notify_all()
        return Done()

    def end_watches(self) -> None:
        """End every watch (their channel ended)."""
        with self._lock:
            self._watches.clear()
            for proc in self._procs.values():
                proc.cond.notify_all()

    def write(self, process_id: str, data: bytes, close: bool) -> ProcInfo:
        """Queue ``data`` for the process's stdin (all or nothing), then close it if ``close``.

        Raises:
            OpError: ``no_process``, ``not_running`` (or its stdin is closed), ``too_large``.
        """
        with self._lock:
            proc = self._get(process_id)
            if proc.state != "running" or proc.stdin is None or proc.close_stdin:
                raise OpError("not_running", f"process {process_id} takes no more input")
            if len(proc.pending) + len(data) > self.limits.stdin_bytes:
                raise OpError(
                    "too_large",
                    f"process {process_id} has {len(proc.pending)} bytes of input it has not read;"
                    f" {len(data)} more would pass {self.limits.stdin_bytes}",
                )
            proc.pending += data
            proc.close_stdin = close
            info = proc.info()
        self._post(lambda: self._feed_later(proc))
        return info

    def signal(self, process_id: str, name: str, grace: float | None) -> ProcInfo:
        """Signal the process's group; with ``grace``, ``SIGKILL`` if the group outlives it, and
        the answer once it is empty (or ``KILL_WAIT_SECONDS`` after the kill)."""
        sig = SIGNALS[name]
        with self._lock:
            proc = self._get(process_id)
            if proc.state != "running":
                return proc.info()
            proc.stopping = proc.stopping or sig in ENDING or grace is not None
            killpg(proc.pid, sig)
            if grace is None:
                return proc.info()
            if not proc.cond.wait_for(lambda: proc.state != "running", grace):
                killpg(proc.pid, signal.SIGKILL)
                proc.cond.wait_for(lambda: proc.state != "running", KILL_WAIT_SECONDS)
            return proc.info()

    def groups(self) -> list[int]:
        """The process groups of the running processes."""
        with self._lock:
            return [p.pid for p in self._procs.values() if p.state == "running"]

    def __len__(self) -> int:
        with self._lock:
            return len(self._procs)

    def shutdown(self) -> None:
        """Kill every running process group (the session is closing, or nothing may outlive the
        agent) and stop the pump."""
        for pgid in self.groups():
            killpg(pgid, signal.SIGKILL)
        self._stopped = True
        self._post(lambda: None)
        self._thread.join(KILL_WAIT_SECONDS)
