"""What a session remembers of its processes and its shell between calls (issue 32), and who
announces their ends.

One ``ProcessMemory`` per open session (``SessionState.processes``), reached by tools through
``ToolContext.processes`` (the ``SessionProcesses`` protocol of ``core/process_api.py``):

- **The shell.** The directory and the exported variables the last ``shell`` command ended with
  (``ShellState``), given to the next one as its cwd and env; ``shell_reset`` forgets them.
  Bounded: at most ``MAX_SHELL_ENV_VARS`` variables and ``MAX_SHELL_ENV_BYTES`` bytes are kept; a
  state past them is not remembered (the model is told) and the previous one stays.
- **Last-read cursors.** Per process, where this session's model last read its output, so that
  ``process_output`` without ``after`` goes on from there. At most ``MAX_CURSORS`` are kept (the
  oldest forgotten: reading such a process again starts from its oldest byte held).
- **Monitors.** ``started`` publishes ``process.started`` and starts one task that waits for the
  process's end (``ProcessControl.wait``) and publishes ``process.exited``: one per running process
  (the sandbox's running bound bounds them; ``MAX_MONITORS`` backs it), cancelled at close. Both
  events carry the ``tool_use_id`` of the call that started the process and an empty turn id.

The shell and the cursors are stored with the session (``to_json``/``restore``: the server's
``state.db``): ``on_change`` is called whenever they change. The monitors are not: after a
restart they are started again when the session is first used (a call, or a process RPC going
through ``ToolDispatcher.processes``), for the processes still running then (``resume``). A
process that ended while no server ran, or before that first use, has no ``process.exited``:
``process_list`` shows how it ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from dispatcher.core.events.payloads import EventPayload, ProcessExited, ProcessStarted
from dispatcher.core.process_api import ProcessControl, ProcessError, ProcessInfo, ShellState
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.text.display import summarize

__all__ = ["MAX_CURSORS", "MAX_MONITORS", "MAX_SHELL_ENV_BYTES", "MAX_SHELL_ENV_VARS", "ProcessMemory"]

log = logging.getLogger("dispatcher.core.sessions")

MAX_CURSORS = 256
"""Last-read cursors kept per session: more than the processes a sandbox keeps (32 running and
64 finished by default)."""
MAX_MONITORS = 256
"""Exit monitors per session: a backstop, as the sandbox's running bound (32) comes first."""
MAX_SHELL_ENV_VARS = 1024
MAX_SHELL_ENV_BYTES = 256 * 1024
"""The remembered environment's bounds (names and values, UTF-8), as the agent reports at most
256 KiB of shell state per command."""

Publish = Callable[[EventPayload, str], None]
"""``publish(payload, tool_use_id)``: an event on the session's bus (turn id empty)."""


class ProcessMemory:
    """One session's shell state, last-read cursors and exit monitors."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self.cwd: str | None = None
        self.env: dict[str, str] = {}
        self.cursors: OrderedDict[str, int] = OrderedDict()
        self.monitors: dict[str, asyncio.Task[None]] = {}
        self.on_change: Callable[[], None] | None = None
        """Told whenever what ``to_json`` gives changed (persistence stores it)."""
        self._resumed = True
        """False after ``restore``: the running processes' ends are not followed yet."""
        self._closed = False

    # -- the shell -----------------------------------------------------------------------------

    def shell_start(self) -> tuple[str | None, Mapping[str, str]]:
        return self.cwd, self.env

    def shell_ended(self, state: ShellState | None) -> str | None:
        if state is None:
            return None
        env = {k: v for k, v in self.env.items() if k not in state.unset}
        env.update(state.env)
        size = sum(
            len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass"))
            for k, v in env.items()
        )
        note = None
        if len(env) > MAX_SHELL_ENV_VARS or size > MAX_SHELL_ENV_BYTES:
            note = (
                f"the exported environment ({len(env):,} variables, {size:,} bytes) is more than the "
                f"{MAX_SHELL_ENV_VARS:,} variables and {MAX_SHELL_ENV_BYTES // 1024} KiB the next command "
                "can be given: its variables were not remembered (unset some, or pass env)"
            )
            env = self.env
        cwd = self.cwd if state.cwd is None else None if state.cwd == "." else state.cwd
        if (cwd, env) != (self.cwd, self.env):
            self.cwd, self.env = cwd, dict(env)
            self._changed()
        return note

    def shell_reset(self, *, cwd_only: bool = False) -> None:
        env = self.env if cwd_only else {}
        if self.cwd is not None or env != self.env:
            self.cwd, self.env = None, env
            self._changed()

    # -- what the model read -------------------------------------------------------------------

    def last_read(self, process_id: str) -> int:
        return self.cursors.get(process_id, 0)

    def read_to(self, process_id: str, cursor: int) -> None:
        if self.cursors.get(process_id) == cursor:
            return
        self.cursors[process_id] = cursor
        self.cursors.move_to_end(process_id)
        while len(self.cursors) > MAX_CURSORS:
            self.cursors.popitem(last=False)
        self._changed()

    # -- announcing processes ------------------------------------------------------------------

    def started(self, info: ProcessInfo, control: ProcessControl, tool_use_id: str | None = None) -> None:
        if info.process_id in self.monitors:
            return  # announced already (a retried start answers the same process)
        caller = tool_use_id or info.tool_use_id or ""
        self._publish(
            ProcessStarted(
                process_id=info.process_id,
                command=str(summarize(info.command)),
                pid=info.pid,
                origin=info.origin,
            ),
            caller,
        )
        self._monitor(info, control, caller)

    @property
    def needs_resume(self) -> bool:
        """Given back by a restart, and the ends of its processes not followed yet."""
        return not self._resumed and not self._closed

    async def resume(self, control: Callable[[], ProcessControl]) -> None:
        """Follow the ends of the processes still running (once, after a restart); ``control``
        gives the session's table (it may say ``unsupported``: nothing to follow)."""
        if not self.needs_resume:
            return
        self._resumed = True
        try:
            table = control()
            infos = await table.list()
        except (ProcessError, SandboxError) as exc:
            log.info("no processes to follow after a restart: %s", exc)
            return
        for info in infos:
            if info.running:
                self._monitor(info, table, info.tool_use_id or "")

    def _monitor(self, info: ProcessInfo, control: ProcessControl, caller: str) -> None:
        pid = info.process_id
        if self._closed or pid in self.monitors:
            return
        if len(self.monitors) >= MAX_MONITORS:
            log.warning("process %s: %d exit monitors already; its end is not announced", pid, MAX_MONITORS)
            return
        task = asyncio.get_running_loop().create_task(self._wait_end(pid, control, caller))
        self.monitors[pid] = task

    async def _wait_end(self, pid: str, control: ProcessControl, caller: str) -> None:
        try:
            ended = await control.wait(pid)
        except (ProcessError, SandboxError) as exc:
            # Forgotten, or the sandbox went (its processes with it): nothing left to announce.
            log.info("process %s: its end cannot be followed: %s", pid, exc)
            return
        finally:
            self.monitors.pop(pid, None)
        self._publish(
            ProcessExited(
                process_id=pid,
                state=ended.state,
                exit_code=ended.exit_code,
                signal=ended.signal,
                output_bytes=ended.end,
            ),
            caller,
        )

    def close(self) -> None:
        """The session ended: stop every monitor (its processes are killed with its sandbox)."""
        self._closed = True
        for task in self.monitors.values():
            task.cancel()
        self.monitors.clear()

    # -- stored with the session ---------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"cwd": self.cwd, "env": dict(self.env), "cursors": dict(self.cursors)}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Take back what ``to_json`` gave (a restarted server).

        Raises:
            ValueError: ``data`` is not such a state.
        """
        cwd, env, cursors = data.get("cwd"), data.get("env", {}), data.get("cursors", {})
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError("processes.cwd must be a string or null")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise ValueError("processes.env must map names to strings")
        if not isinstance(cursors, dict) or not all(
            isinstance(k, str) and type(v) is int and v >= 0 for k, v in cursors.items()
        ):
            raise ValueError("processes.cursors must map process ids to cursors")
        self.cwd, self.env = cwd, dict(env)
        self.cursors = OrderedDict(list(cursors.items())[-MAX_CURSORS:])
        self._resumed = False

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
