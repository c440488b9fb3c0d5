"""Commands: each runs as ``sh -c`` in its own process group, its output streamed back in frames.

A command starts with the agent's own environment (``docker exec`` gives it the container's
configured one: the image's ``ENV``), minus names starting ``DISPATCHER_AGENT_``, with no terminal
(``TERM=dumb``, ``PAGER=cat``, ``GIT_PAGER=cat``), plus ``env``; in ``cwd`` (relative to the root,
confined like every path); with stdin ``/dev/null`` unless the request brings some. With
``capture_state`` it reports the directory and exported variables it ended with
(``shell_state.py``).

Commands run on threads started with the agent (a full pids limit cannot starve it). Background
processes outlive their command; those still holding its output pipes once its shell exited
become a process of the table (``table.py``), read on and named in the exit. ``start`` starts a
background process of the table directly. ``procs`` counts what commands left running, and with ``kill``
stops and kills all of it (a fork bomb included): every process but the agent and those that ran
before it (init, the container's keep-alive process); an agent running as root kills nothing,
since it is not in a sandbox. ``pause`` stops (``SIGSTOP``) the same processes and later
continues (``SIGCONT``) exactly those it stopped: a paused session where the sandbox cannot be
frozen (a Pod). Unlike a cgroup freeze, processes can tell: their parents get ``SIGCHLD``, and a
process that handles ``SIGCONT`` runs its handler on resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from typing import IO, NoReturn

from .process import new_process_id
from .protocol import (
    CHUNK,
    Delivered,
    Exec,
    Exit,
    Output,
    Pause,
    Paused,
    ProcInfo,
    Procs,
    ProcsResult,
    ProcStart,
    Send,
    SendSignal,
)
from .shell_state import COMMAND_VARIABLE, StateFiles, command_argv, take_state
from .table import ProcessTable
from .workers import Workers
from .workspace import OpError, Workspace, os_error

COALESCE_SECONDS = 0.01  # small writes wait this long for company before being sent
DRAIN_SECONDS = 0.2  # after sh exits, how long background children may keep the pipes busy
KILL_STRAYS_SECONDS = 3.0  # how long `procs` with kill keeps stopping and killing a fork bomb
_SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT}


def _killpg(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class _Running:
    """A running command, addressable by the request id that started it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pgid: int | None = None
        self.early: list[int] = []  # signals that arrived before the process existed
        self.signalled = False
        self.finished = False

    def signal(self, sig: int) -> bool:
        with self.lock:
            self.signalled = True
            if self.finished:
                return False
            if self.pgid is None:
                self.early.append(sig)
                return True
            return _killpg(self.pgid, sig)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # the name in parentheses may hold anything
    try:
        return fields[0].decode("ascii", "replace"), int(fields[19])
    except (IndexError, ValueError):
        return None


KEEPALIVE_CMDLINE = b"sleep\x002147483647\x00"
"""The container's own command (see the sandbox provider): it keeps the container up."""


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read(64)
    except OSError:
        return b""


def _ppid(pid: int) -> int | None:
    return _parent_and_session(pid)[0]


def _parent_and_session(pid: int) -> tuple[int | None, int | None]:
    """(parent pid, session id) from ``/proc/<pid>/stat``, in one read; Nones once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rfind(b")") + 2 :].split()  # after the name: state, ppid, pgrp, session
        return int(fields[1]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None, None


def _outside_exec_sessions(found: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """``found`` less the sessions ``docker exec`` started: their leader has no parent in the
    container (parent pid 0), as a process the server attached on its own does (a sandboxed MCP
    server). Nothing a command starts can have parent 0: it descends from the agent."""
    ids = {pid: _parent_and_session(pid) for pid, _, _ in found}
    leaders = {pid for pid, (ppid, session) in ids.items() if ppid == 0 and session == pid}
    return [p for p in found if ids[p[0]][1] not in leaders] if leaders else found


def _container_own(found: list[tuple[int, str, int]]) -> set[tuple[int, int]] | None:
    """(pid, start) of the container's own processes: init and the keep-alive it started first,
    or the keep-alive as pid 1; None when this is not a sandbox container."""
    starts = {pid: start for pid, _, start in found}
    if 1 not in starts:
        return None
    if _cmdline(1) == KEEPALIVE_CMDLINE:
        return {(1, starts[1])}
    # Nothing a command starts can come before the keep-alive, so no command can pass for it.
    others = sorted((start, pid) for pid, start in starts.items() if pid != 1)
    if others:
        start, pid = others[0]
        if _ppid(pid) == 1 and _cmdline(pid) == KEEPALIVE_CMDLINE:
            return {(1, starts[1]), (pid, start)}
    return None


class _Strays:
    """The processes that the sandbox's commands started, found through ``/proc``.

    Everything but the agent and the container's own processes: init (pid 1) and the keep-alive
    process it started first. Processes an earlier agent's commands left running count too (a
    restarted server starts a new agent in the same container). Each process is known by pid and
    start time, so a recycled pid is never taken for another process: not for one of those
    spared, not for one about to be signalled.
    """

    def __init__(self) -> None:
        self._own = os.getpid()
        found = self._scan()
        own = _container_own(found)
        self.in_container = own is not None
        """In a sandbox container (not the local backend, which runs the agent on the host)."""
        # Outside a sandbox container: everything that ran before is spared.
        self._before = own or {(pid, start) for pid, _, start in found}

    def _scan(self) -> list[tuple[int, str, int]]:
        try:
            names = os.listdir("/proc")
        except OSError:
            return []
        found = []
        for name in names:
            if name.isdigit() and int(name) != self._own:
                info = _proc_stat(int(name))
                if info is not None:
                    found.append((int(name), info[0], info[1]))
        return found

    def spare(self, pid: int) -> None:
        """Never count ``pid`` (a successor agent, which stands for this one) as a stray."""
        info = _proc_stat(pid)
        if info is not None:
            self._before.add((pid, info[1]))

    def list(self) -> list[tuple[int, str, int]]:
        """(pid, state, start time) of each stray, zombies included (they hold a pid too)."""
        return [p for p in self._scan() if (p[0], p[2]) not in self._before]

    def kill_all(self, deadline: float) -> int:
        """Stop, then kill, every stray until none is left or ``deadline``; returns how many.

        A fork bomb forks again while it is being killed: stopping everything first leaves
        nothing that can fork, then the kills, then a new round for what slipped through.
        """
        killed: set[tuple[int, int]] = set()
        while time.monotonic() < deadline:
            live = [(pid, start) for pid, state, start in self.list() if state not in "ZX"]
            if not live:
                break
            for pid, start in live:
                _signal_process(pid, start, signal.SIGSTOP)
            for pid, start in live:
                if _signal_process(pid, start, signal.SIGKILL):
                    killed.add((pid, start))
        # The dead keep their pids until init reaps them; a command started before that fails.
        while self.list() and time.monotonic() < deadline:
            time.sleep(0.005)
        return len(killed)

    def stop_all(self, deadline: float, stopped: set[tuple[int, int]]) -> int:
        """Stop every stray not stopped already, adding each to ``stopped``; returns how many.

        Rounds until one finds nothing new to stop: a process signalled while it forks has its
        fork restarted (the kernel's rule), so what the last round found is everything. A
        process something else had stopped (state ``T``) is left out: it is not ours to continue.
        """
        count = 0
        while time.monotonic() < deadline:
            fresh = [(pid, start) for pid, state, start in self.list() if state not in "ZXTt"]
            fresh = [p for p in fresh if p not in stopped]
            if not fresh:
                break
            for pid, start in fresh:
                if _signal_process(pid, start, signal.SIGSTOP):
                    stopped.add((pid, start))
                    count += 1
        return count


def _signal_process(pid: int, start: int, sig: int) -> bool:
    """Signal the process ``pid`` only if it is still the one that started at ``start``."""
    fd: int | None = None
    try:
        fd = os.pidfd_open(pid)  # pins the process: the check below cannot go stale
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):
        fd = None  # no pidfd (old kernel, gVisor): the start time check still narrows the race
    try:
        info = _proc_stat(pid)
        if info is None or info[1] != start:
            return False
        if fd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


AGENT_ENV_PREFIX = "DISPATCHER_AGENT_"  # reserved for the agent's own settings; never passed on
_DEFAULT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
}
NO_TERMINAL_ENV = {"TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat"}
"""What every command gets whatever the image says (only a request's own ``env`` overrides it):
nobody is at a terminal to page through output or answer a full-screen program."""


def command_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment every command starts from: the agent's own, which ``docker exec`` took from
    the container's configuration (the image's ``ENV``), minus the agent's reserved names, with
    defaults for what a shell expects, and no terminal."""
    env = {key: value for key, value in environ.items() if not key.startswith(AGENT_ENV_PREFIX)}
    for key, value in _DEFAULT_ENV.items():
        env.setdefault(key, value)
    env.update(NO_TERMINAL_ENV)
    return env


def _feed(pipe: IO[bytes] | None, data: bytes) -> None:
    if pipe is None:
        return
    try:
        pipe.write(data)
    except OSError:
        pass  # the command stopped reading; that is its business
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


class Commands:
    """The commands the agent runs, by the id of the request that started each, and their leftovers."""

    def __init__(self, ws: Workspace, send: Send, pool: Workers, table: ProcessTable) -> None:
        self._ws = ws
        self.table = table
        self._states = StateFiles()
        self._send = send
        self._pool = pool  # also feeds a command's stdin
        self._execs: dict[int, _Running] = {}
        self._lock = threading.Lock()
        self._lingering: set[int] = set()  # groups of finished commands that left children running
        self._strays = _Strays()
        self._env = command_env(os.environ)
        self._pause_lock = threading.Lock()
        self._stopped: set[tuple[int, int]] = set()
        """(pid, start time) of each process ``pause`` stopped, until it continues them."""

    @property
    def in_container(self) -> bool:
        """In a sandbox container (not the local backend, which runs the agent on the host)."""
        return self._strays.in_container

    def add_env(self, extra: Mapping[str, str]) -> None:
        """Every command from now on also gets ``extra`` (a request's own ``env`` still wins)."""
        with self._lock:
            self._env = {**self._env, **extra}

    def exec_of(self, lineage: list[tuple[int, int, int]]) -> int | None:
        """The running exec whose command started the first of ``lineage`` ((pid, process group,
        session) of a process and its ancestors) that belongs to one: each command is the leader
        of its own session and group, which its children stay in unless they leave them."""
        with self._lock:
            groups = {ex.pgid: rid for rid, ex in self._execs.items() if ex.pgid is not None}
        for pid, pgrp, session in lineage:
            for key in (pid, pgrp, session):
                if key in groups:
                    return groups[key]
        return None

    def signal(self, rid: int, request: SendSignal) -> Delivered:
        """Signal a running command's process group."""
        with self._lock:
            ex = self._execs.get(request.exec_id)
        return Delivered(ex.signal(_SIGNALS[request.signal]) if ex is not None else False)

    def _env_for(self, extra: Mapping[str, str]) -> dict[str, str]:
        with self._lock:
            env = dict(self._env)
        env.update(extra)
        return env

    @contextlib.contextmanager
    def _cwd(self, cwd: str, approved: str | None) -> Iterator[str]:
        """The directory a command starts in, as a path to its checked descriptor (open meanwhile):
        the child changes into that, not into a name that could be swapped."""
        try:
            cwd_fd, path = self._ws.open_cwd(cwd, approved)
        except OSError as exc:
            raise os_error(exc, cwd) from None
        try:
            fd_path = f"/proc/self/fd/{cwd_fd}"
            if os.path.isdir(fd_path):
                path = fd_path
            elif approved is not None:  # the name could be swapped: no approved start by it
                raise OpError("ENOTSUP", f"{cwd}: no /proc to start a command in an approved directory")
            yield path
        finally:
            os.close(cwd_fd)

    def start(self, rid: int, request: ProcStart) -> ProcInfo:
        """Start a background process of the table (see ``ProcStart``)."""
        env = self._env_for(request.env)
        with self._cwd(request.cwd, request.approved_cwd) as cwd:
            try:
                return self.table.start(
                    request.process_id,
                    request.command,
                    cwd=cwd,
                    shown_cwd=request.cwd,
                    env=env,
                    tool_use_id=request.tool_use_id,
                    ring_bytes=request.ring_bytes,
                )
            except BlockingIOError:  # EAGAIN from fork: the pids limit is full
                self.no_process(rid)
            except OSError as exc:
                raise os_error(exc, "/bin/sh") from None

    def begin(self, rid: int) -> None:
        """Make an exec addressable before a thread takes it up: a signal for it that is read
        meanwhile (a timeout while the threads are busy) waits in ``early`` instead of being lost.

        Raises:
            OpError: ``bad_request``, the id is in use.
        """
        with self._lock:
            if rid in self._execs:
                raise OpError("bad_request", f"exec id {rid} is in use")
            self._execs[rid] = _Running()

    def end(self, rid: int) -> None:
        """Forget an exec ``begin`` made addressable (ended, or never started)."""
        with self._lock:
            self._execs.pop(rid, None)

    def run(self, rid: int, request: Exec) -> None:
        """Run a command ``begin`` made addressable to its end, sending its output and then its exit."""
        try:
            with self._lock:
                ex = self._execs[rid]
            env = self._env_for(request.env)
            if "\x00" in request.command:
                raise OpError("bad_request", "command contains a NUL byte")
            with self._cwd(request.cwd, request.approved_cwd) as cwd:
                self._run(rid, ex, request, cwd, env)
        finally:
            self.end(rid)

    def _run(self, rid: int, ex: _Running, request: Exec, cwd: str, env: dict[str, str]) -> None:
        stdin = request.stdin
        state = self._states.new() if request.capture_state else None
        try:
            proc = subprocess.Popen(
                command_argv(state),
                cwd=cwd,
                env={**env, COMMAND_VARIABLE: request.command},
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so signals reach every child
                close_fds=True,
            )
        except BlockingIOError:  # EAGAIN from fork: the pids limit is full
            self.no_process(rid)
        except OSError as exc:
            raise os_error(exc, "/bin/sh") from None
        with ex.lock:
            ex.pgid = proc.pid
            for sig in ex.early:
                _killpg(proc.pid, sig)
        if stdin is not None and not self._pool.try_submit(_feed, proc.stdin, stdin):
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            self.no_process(rid)
        assert proc.stdout is not None and proc.stderr is not None
        held: dict[int, str] = {}
        left: tuple[str, ...] = ()
        try:
            for pipe, stream in self._pump(rid, proc):  # the pipes children still hold
                held[os.dup(pipe.fileno())] = stream
        finally:
            proc.stdout.close()
            proc.stderr.close()
            code = proc.wait()
            with ex.lock:
                ex.finished = True
                if ex.signalled:  # a killed command leaves no stragglers in its group
                    _killpg(proc.pid, signal.SIGKILL)
                elif held or _killpg(proc.pid, 0):
                    self._remember_group(proc.pid)
                    # Only what still holds the pipes: a group that let go of them is left as it
                    # always was (``procs`` counts it; see the module docstring of ``table.py``).
                    process_id = request.leave_as or new_process_id()
                    if held and self.table.adopt(process_id, request.command, request.cwd, proc.pid, held):
                        held, left = {}, (process_id,)
            for fd in held:
                os.close(fd)
        cwd_now: str | None = None
        changed: dict[str, str] | None = None
        unset: tuple[str, ...] = ()
        if state is not None:
            cwd_now, changed, unset = take_state(state, self._ws.root, env)
        ended = Exit(code, None) if code >= 0 else Exit(None, -code)
        self._send(rid, dataclasses.replace(ended, left=left, cwd=cwd_now, env=changed, unset=unset))

    def no_process(self, rid: int, request: object = None) -> NoReturn:
        """Refuse a command that could not get a process (or a thread) from the pids limit."""
        count = len(self._strays.list())
        raise OpError(
            "proc_limit",
            f"cannot start a process: the sandbox's process limit is exhausted ({count} processes"
            " left running by earlier commands)",
            count,
        )

    def procs(self, rid: int, request: Procs) -> ProcsResult:
        """Count the processes commands left behind; with ``kill``, stop and kill all of them."""
        found = self._strays.list()
        if request.spare_exec_sessions:  # asking whether commands still work
            found = _outside_exec_sessions(found)
        processes, killed = sum(1 for _, state, _ in found if state not in "ZX"), 0
        if request.kill:
            if os.geteuid() == 0:  # not in a sandbox (sandboxes never run as root): touch nothing
                raise OpError("bad_request", "the agent runs as root; it kills no processes")
            killed = self._strays.kill_all(time.monotonic() + KILL_STRAYS_SECONDS)
        return ProcsResult(processes, killed, len(self._strays.list()))

    def pause(self, rid: int, request: Pause) -> Paused:
        """Stop what commands started, or continue what earlier pauses stopped (see ``Pause``)."""
        if os.geteuid() == 0:  # not in a sandbox (sandboxes never run as root): touch nothing
            raise OpError("bad_request", "the agent runs as root; it stops no processes")
        with self._pause_lock:
            if request.paused:
                return Paused(self._strays.stop_all(time.monotonic() + KILL_STRAYS_SECONDS, self._stopped))
            stopped, self._stopped = self._stopped, set()
            return Paused(sum(_signal_process(pid, start, signal.SIGCONT) for pid, start in stopped))

    def _remember_group(self, pgid: int) -> None:
        with self._lock:
            # Forget groups that have emptied since, so neither the set nor a reused id lingers.
            self._lingering = {g for g in self._lingering if _killpg(g, 0)}
            self._lingering.add(pgid)

    def _pump(self, rid: int, proc: subprocess.Popen[bytes]) -> list[tuple[IO[bytes], str]]:
        """Forward output in chunks of at most CHUNK, coalescing small writes briefly; returns the
        pipes (and their streams) that background children still hold ``DRAIN_SECONDS`` after
        the shell exited.

        One pending buffer for both streams keeps their relative order. The agent only reads
        more after a frame went out, so a slow host back-pressures the command through its pipe.
        """
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        pending = bytearray()
        stream = "stdout"
        since = 0.0
        exited_at: float | None = None

        def flush() -> None:
            if pending and not self._send(rid, Output(stream, bytes(pending))):
                _killpg(proc.pid, signal.SIGKILL)  # nobody is listening any more
            pending.clear()

        with sel:
            while sel.get_map():
                now = time.monotonic()
                wait = 0.05
                if pending:
                    wait = min(wait, since + COALESCE_SECONDS - now)
                if exited_at is not None:
                    if now >= exited_at + DRAIN_SECONDS:
                        break  # background children hold the pipes: the table reads on
                    wait = min(wait, exited_at + DRAIN_SECONDS - now)
                for key, _ in sel.select(max(wait, 0.0)):
                    if pending and key.data != stream:
                        flush()
                    data = os.read(key.fd, CHUNK - len(pending))
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    if not pending:
                        since = time.monotonic()
                    stream = key.data
                    pending += data
                    if len(pending) >= CHUNK:
                        flush()
                if pending and time.monotonic() >= since + COALESCE_SECONDS:
                    flush()
                if exited_at is None and proc.poll() is not None:
                    exited_at = time.monotonic()
            flush()
            return [(key.fileobj, key.data) for key in sel.get_map().values()]  # type: ignore[misc]

    def spare(self, pid: int) -> None:
        """A successor agent's process is not one a command started."""
        self._strays.spare(pid)

    def end_channel(self) -> None:
        """Kill every running command: its answer has nowhere to go."""
        with self._lock:
            running = list(self._execs.values())
        for ex in running:
            ex.signal(signal.SIGKILL)

    def shutdown(self, keep_background: bool) -> None:
        """Kill every running command and, unless ``keep_background``, what finished ones left."""
        self.end_channel()
        with self._lock:
            lingering = [] if keep_background else list(self._lingering)
        for pgid in lingering:
            _killpg(pgid, signal.SIGKILL)
        if not keep_background:
            self.table.shutdown()
