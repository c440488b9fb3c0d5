"""Local backend: the real agent as a plain subprocess per session, without a container.

NOT a security boundary. Commands run as the server's user with the server's access to the
host; only file operations are confined to the workspace (by the agent). It exists for unit
tests and for development on machines without Docker.

Background processes (``processes()``) live in the agent's table as in a container, with one
difference: nothing bounds a host process but its agent, so the agent kills its table when its
channel ends, and an agent that died without doing so (``SIGKILL``) has the groups it was last
seen running killed here. They do not survive a server restart (nor an agent that died:
``no_process`` then says so), and a paused session's processes are not frozen.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from dispatcher.core.process_api import ProcessControl
from dispatcher.core.provider_api import NO_HOOKS, ProviderHooks, SandboxProvider
from dispatcher.core.sandbox_api import (
    AttachedProcess,
    ExecRequest,
    ExecResult,
    OutputCallback,
    PortStream,
    SandboxError,
    check_port,
    report_notice,
)
from dispatcher.sandbox.agent_files import AgentFiles
from dispatcher.sandbox.channel import DEFAULT_MAX_FRAME, AgentChannel, AgentUnresponsive
from dispatcher.sandbox.container.config import ProcessLimits, process_limit_args
from dispatcher.sandbox.grants import agent_grant_args
from dispatcher.sandbox.host_process import HostProcess
from dispatcher.sandbox.processes.control import AgentProcesses
from dispatcher.sandbox.tunnels import TunnelSetup, tunnel_setup

if TYPE_CHECKING:
    from dispatcher.core.sessions.session import Session

AGENT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent")
"""The agent package's directory, which ``python3 -I`` runs as it is (its ``__main__.py``)."""
STOP_TIMEOUT_SECONDS = 2.0  # after closing its stdin, before the agent is killed outright


T = TypeVar("T")


class LocalSandbox(AgentFiles):
    """A lazy per-session handle: the agent starts on first use and restarts if it died."""

    def __init__(
        self,
        workspace_path: str,
        *,
        python: str = sys.executable,
        max_frame: int = DEFAULT_MAX_FRAME,
        kill_wait: float = 2.0,
        agent_args: Sequence[str] = (),
        process_limits: ProcessLimits | None = None,
        tunnels: Callable[[], TunnelSetup | None] = lambda: None,
    ) -> None:
        self._tunnels = tunnels  # the egress proxy's listener, on any free port of the host's loopback
        self._workspace = os.path.abspath(workspace_path)
        # The session's --grants, and --process-limits when not the agent's defaults.
        self._agent_args = (*agent_args, *process_limit_args(process_limits))
        self._python = python
        self._max_frame = max_frame
        self._kill_wait = kill_wait
        self._proc: asyncio.subprocess.Process | None = None
        self._channel: AgentChannel | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self.proxy_port: int | None = None
        """Where the agent's proxy listener is (on the host's loopback), once it listens."""
        self.notice: str | None = None
        """Said in the next call's result (the session was resumed): a process does not freeze."""
        self.generation = 0
        """Agents restarted after one ended (each took its background processes along)."""
        self.last_removal: str | None = None
        self._processes: AgentProcesses | None = None
        self._reaper: asyncio.Task[None] | None = None

    @property
    def workspace_root(self) -> str:
        return self._workspace

    @property
    def pid(self) -> int | None:
        """Process id of the running agent, if any (for tests and diagnostics)."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def channel(self) -> AgentChannel:
        """The live channel, (re)starting the agent when there is none or it broke."""
        if self.notice is not None and report_notice(self.notice):
            self.notice = None
        current = self._channel
        if current is not None and not current.broken:
            return current
        async with self._lock:
            if self._closed:
                raise SandboxError("the sandbox is closed")
            if self._channel is not None and not self._channel.broken:
                return self._channel
            if self._channel is not None:
                self._agent_ended()
            await self._stop()
            os.makedirs(self._workspace, exist_ok=True)
            # A bare environment: commands inherit the agent's, so nothing else of the server's leaks.
            env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
            proc = await asyncio.create_subprocess_exec(
                self._python,
                "-I",  # isolated: nothing of the environment or the user's site-packages
                AGENT_PATH,
                "--root",
                self._workspace,
                *self._agent_args,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            assert proc.stdout is not None and proc.stdin is not None
            self._proc = proc
            self._reaper = asyncio.get_running_loop().create_task(self._when_gone(proc))
            channel = AgentChannel(
                proc.stdout,
                proc.stdin,
                workspace_root=self._workspace,
                max_frame=self._max_frame,
                kill_wait=self._kill_wait,
            )
            setup = self._tunnels()
            if setup is not None:
                self.proxy_port = await channel.open_tunnels(setup.serve, port=0, env=setup.env)
            self._channel = channel
            return channel

    async def _when_gone(self, proc: asyncio.subprocess.Process) -> None:
        """Once the agent exited: if it did not end cleanly (killed), the process groups of its
        table it could not kill itself are killed (a pgid is only reused once its group is empty)."""
        if await proc.wait() != 0 and self._processes is not None:
            for pgid in self._processes.forget_groups():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)

    def _agent_ended(self) -> None:
        self.generation += 1
        self.last_removal = "its agent process had ended"

    async def _stop(self) -> None:
        channel, self._channel = self._channel, None
        proc, self._proc = self._proc, None
        if channel is not None:
            await channel.close()  # stdin EOF: the agent kills its commands and exits
        if proc is None:
            return
        try:
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        finally:
            # asyncio keeps a subprocess transport open until it is closed (no public way on the
            # Process): otherwise it warns "unclosed transport" whenever the collector finds it.
            transport: asyncio.SubprocessTransport = proc._transport  # type: ignore[attr-defined]
            transport.close()
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            await asyncio.gather(reaper, return_exceptions=True)

    async def aclose(self) -> None:
        """Stop the agent; later calls raise ``SandboxError``."""
        if self._processes is not None:
            self._processes.close()
        async with self._lock:
            self._closed = True
            await self._stop()

    @contextlib.asynccontextmanager
    async def agent_channel(self, what: str) -> AsyncIterator[AgentChannel]:
        """The live agent channel for one long operation (a tree transfer)."""
        yield await self.channel()

    async def _file_op(self, what: str, op: Callable[[AgentChannel], Awaitable[T]]) -> T:
        return await op(await self.channel())

    def quota_note(self) -> str | None:
        """No quota here."""
        return None

    async def connect_port(self, port: int) -> PortStream:
        """See ``Sandbox.connect_port``: through the agent (its loopback is the host's here)."""
        check_port(port)
        return await (await self.channel()).connect_port(port)

    def processes(self) -> ProcessControl:
        """The session's process table, in its agent (see the module's note)."""
        return self._agent_processes()

    def _agent_processes(self) -> AgentProcesses:
        if self._processes is None:
            self._processes = AgentProcesses(self)
        return self._processes

    # -- ``processes.control.ProcessHost`` ------------------------------------------------------

    async def process_op(
        self, what: str, op: Callable[[AgentChannel], Awaitable[T]], *, launch: bool, extra_seconds: float
    ) -> T | None:
        """``op`` on the agent's channel; None when no agent runs and ``launch`` is False."""
        channel = await self.channel() if launch else await self.process_channel()
        return None if channel is None else await op(channel)

    async def process_channel(self) -> AgentChannel | None:
        """The running agent's channel; None when none runs (none is started)."""
        if self.notice is not None and report_notice(self.notice):
            self.notice = None
        current = self._channel
        if self._closed or current is None:
            return None
        if current.broken:  # it died, its processes with it: nothing runs until a call starts one
            async with self._lock:
                if self._channel is current:
                    self._agent_ended()
                    await self._stop()
            return None
        return current

    async def thawed(self) -> None:
        """Nothing is frozen here."""

    async def start_process(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], *, limit: int
    ) -> AttachedProcess:
        """A host process in the workspace directory, as the server's user (see the module's
        warning)."""
        return await HostProcess.start(name, argv[0], tuple(argv[1:]), env, cwd=self._workspace, limit=limit)

    async def exec(
        self, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
    ) -> ExecResult:
        """See ``Sandbox.exec``; an unresponsive agent is stopped now and restarted on the next call."""
        try:
            result = await (await self.channel()).exec(request, on_output, cancel_event)
        except AgentUnresponsive:
            async with self._lock:
                await self._stop()
            raise
        if result.left:
            self._agent_processes().saw_left(result.left)
        return result


class LocalSandboxProvider(SandboxProvider):
    """``SandboxProvider`` running one local agent subprocess per session (no isolation)."""

    def __init__(
        self,
        *,
        python: str = sys.executable,
        max_frame: int = DEFAULT_MAX_FRAME,
        hooks: ProviderHooks = NO_HOOKS,
        process_limits: ProcessLimits | None = None,
    ) -> None:
        self.take_hooks(hooks)
        self._process_limits = process_limits
        self._python = python
        self._max_frame = max_frame
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._notices: dict[str, str] = {}
        """Resumed before its sandbox was first used: told at its first call."""

    def sandbox_for(self, session: Session) -> LocalSandbox:
        """The session's lazy sandbox handle; the agent starts on its first call."""
        sandbox = self._sandboxes.get(session.session_id)
        if sandbox is None:
            sandbox = LocalSandbox(
                session.workspace_path,
                python=self._python,
                max_frame=self._max_frame,
                agent_args=agent_grant_args(session),
                process_limits=self._process_limits,
                tunnels=lambda: tunnel_setup(self.egress, session),
            )
            self._sandboxes[session.session_id] = sandbox
            sandbox.notice = self._notices.pop(session.session_id, None)
        return sandbox

    async def close_session(self, session_id: str) -> None:
        """Stop the session's agent; its workspace stays."""
        sandbox = self._sandboxes.pop(session_id, None)
        self._notices.pop(session_id, None)
        if sandbox is not None:
            await sandbox.aclose()

    # ``working`` stays the default (never): the local agent sees every process of the host, so a
    # count would keep every session alive on a busy machine. Docker counts its container's own.

    async def resume(self, session_id: str, *, notice: str | None = None) -> None:
        """Nothing was frozen (the local backend has no container to pause); the notice is kept."""
        sandbox = self._sandboxes.get(session_id)
        if sandbox is not None and notice:
            sandbox.notice = notice
        elif notice:
            self._notices[session_id] = notice

    async def aclose(self) -> None:
        """Stop every agent."""
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        await asyncio.gather(*(sandbox.aclose() for sandbox in sandboxes))
