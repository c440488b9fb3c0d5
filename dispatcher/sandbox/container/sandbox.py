"""One session's container sandbox: the agent channel, with the container's host as its enforcer.

Calls go to the in-container agent over its stream (a ``docker exec``'s, the agent's socket, a Pod's
attach). Around every call sits the enforcement the agent cannot provide for itself
(``exec_guard.py``, ``file_guard.py``): if the channel breaks (the agent died), the agent raises
``AgentUnresponsive``, or a command outlives timeout + grace + slack, the container is removed
through its host (``host.py``) and the next call creates a fresh one. The in-flight exec then
returns with the output it streamed so far and ``killed=True``; a file operation raises
``SandboxError``, which the dispatcher reports as an ``execution_error``.

What a call must know about its sandbox reaches its result as a notice (``report_notice``): the
sandbox was recreated since the last call (and why), so ``/tmp`` and background processes are
gone; leftover processes that filled the pids limit were killed. A request that never reached a
live agent (the channel was already broken) is retried once in a fresh sandbox; a command refused
for want of a process is retried once after the leftovers are killed, then once in a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TypeVar, cast

from dispatcher.core.observe import SandboxRemoval
from dispatcher.core.process_api import ProcessControl
from dispatcher.core.sandbox_api import (
    AttachedProcess,
    ExecRequest,
    ExecResult,
    FileOpError,
    OutputCallback,
    PortStream,
    SandboxError,
    check_port,
    report_notice,
)
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.agent_files import AgentFiles
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.container.exec_guard import run_command
from dispatcher.sandbox.container.file_guard import guarded_file_op, held_channel
from dispatcher.sandbox.container.host import ContainerHost, LiveContainer
from dispatcher.sandbox.container.pause import Pausing
from dispatcher.sandbox.container.processes import ContainerProcessHost
from dispatcher.sandbox.processes.control import AgentProcesses

log = logging.getLogger(__name__)
T = TypeVar("T")
_NOT_RUNNING: LiveContainer = cast(LiveContainer, object())
"""``_usable``'s answer when no container runs and none was to be launched."""


class ContainerSandbox(Pausing, AgentFiles):
    """Implements ``dispatcher.core.sandbox_api.Sandbox`` for one session. Pausing its container
    is in ``pause.py`` (``Pausing``), its side of a restart in ``adopt.py`` (``Adoption``)."""

    def __init__(self, provider: ContainerHost, session: Session) -> None:
        self._provider = provider
        self.session = session
        self._live: LiveContainer | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._active = 0
        """Calls using the container or waiting to."""
        self._running = 0
        """Calls using the container."""
        self._quiet = asyncio.Event()
        """Set while no call uses the container."""
        self._quiet.set()
        self.last_used = self._provider.clock()
        self.recreations = 0
        """Containers removed by enforcement or idleness (tests and metrics read it)."""
        self._lost: str | None = None
        """Why the last container was removed, until a call's result has said so."""
        self._adopt: str | None = None
        """A container a previous server life started for this session, to re-attach (not launch)."""
        self._adopt_started: float | None = None
        """When that container started, on this process's monotonic clock."""
        self.unstored = False
        """Given back by a restart with no stored container (``expect_labelled``), until the sweep."""
        self._thawed = asyncio.Event()
        self._thawed.set()
        self._resumed: str | None = None
        """The session was resumed: said in the next call's result."""
        self.generation = 0
        """Containers of this session replaced so far (each took its background processes along)."""
        self.last_removal: str | None = None
        """Why the last one was replaced."""
        self._processes: AgentProcesses | None = None

    @property
    def workspace_root(self) -> str:
        return WORKSPACE_ROOT

    @property
    def container_id(self) -> str | None:
        return self._live.container_id if self._live else None

    @property
    def host(self) -> ContainerHost:
        """The host that runs its container: its config, its clock, what only it can do."""
        return self._provider

    @contextlib.asynccontextmanager
    async def using(self) -> AsyncIterator[LiveContainer]:
        """The live container (created or re-adopted on demand), counted as in use for the block."""
        live = await self._acquire()
        assert live is not None  # launched
        try:
            yield live
        finally:
            self._release()

    @contextlib.asynccontextmanager
    async def using_running(self) -> AsyncIterator[LiveContainer | None]:
        """As ``using``, but None when no container runs (one to re-adopt is): nothing is launched."""
        live = await self._acquire(launch=False)
        if live is None:
            yield None
            return
        try:
            yield live
        finally:
            self._release()

    # -- lifecycle -----------------------------------------------------------------------

    async def _acquire(self, *, launch: bool = True) -> LiveContainer | None:
        """The live container, created (or recreated) on demand; counts the call as active.
        Without ``launch``: None (not counted) when no container runs.

        A container past ``max_lifetime_seconds`` is retired here once no call runs in it: a new
        call waits for the running ones (each bounded by its timeout), so calls kept overlapping
        cannot keep an old container forever.
        """
        self._active += 1
        self.last_used = self._provider.clock()
        try:
            while True:
                async with self._lock:
                    live = await self._usable(launch)
                    if live is _NOT_RUNNING:
                        self._active -= 1
                        return None
                    if live is not None:
                        self._running += 1
                        self._quiet.clear()
                        return live
                await self._quiet.wait()  # an old container: its running calls end first
        except BaseException:
            self._active -= 1
            self.last_used = self._provider.clock()
            raise

    async def _usable(self, launch: bool = True) -> LiveContainer | None:
        """Under the lock: the container a call may use now, launched if need be (else
        ``_NOT_RUNNING``); None while an old container still runs calls."""
        if self._closed:
            # A call that raced CloseSession must not bring a container back to life.
            raise SandboxError(f"session {self.session.session_id} is closed")
        live = self._live
        if live is not None and live.broken:
            await self._discard(live, "its agent or its container had died", SandboxRemoval.DIED)
            live = None
        if live is not None and self._too_old(live, self._provider.clock()):
            if self._running:
                return None
            await self._retire(live)
            live = None
        if live is None and self._adopt is not None:
            # Bounded (a thousand sessions' first calls after a restart must not start a thousand
            # agents at once), in slots the background re-adoptions do not take.
            async with self._provider.adoption_slot():
                await self._adopt_locked()
            live = self._live
        if live is None and not launch:
            return _NOT_RUNNING
        if live is None:
            live = self._live = await self._provider.launch(self.session)
            self._provider.container_changed(self.session.session_id, live.container_id)
        if self._resumed is not None and report_notice(self._resumed):
            self._resumed = None
        if self._lost is not None and report_notice(
            f"the sandbox was recreated for this call: the previous one was removed ({self._lost});"
            " its /tmp files and the processes left running in it are gone"
            " (the workspace is intact)"
        ):
            self._lost = None
        return live

    def _release(self) -> None:
        self._active -= 1
        self._running -= 1
        if not self._running:
            self._quiet.set()
        self.last_used = self._provider.clock()

    async def _discard(self, live: LiveContainer, reason: str, kind: SandboxRemoval) -> None:
        """Forget ``live`` and remove its container, unless a newer one already replaced it."""
        if self._live is not live:
            return
        self._provider.observer.sandbox_removed(kind)
        self._live = None
        self._lost = reason
        self._replaced(reason)
        self.recreations += 1
        self._provider.container_changed(self.session.session_id, None)
        log.warning(
            "removing sandbox container %s of session %s: %s",
            live.container_id[:12],
            self.session.session_id,
            reason,
        )
        await self._provider.destroy(live)

    async def stop_for(self, reason: str, kind: SandboxRemoval = SandboxRemoval.QUOTA) -> None:
        """Remove the running container now (a quota was exceeded); the next call decides anew."""
        async with self._lock:
            if self._live is not None:
                await self._discard(self._live, reason, kind)

    async def enforce(
        self,
        live: LiveContainer,
        reason: str,
        *,
        tell: bool = True,
        kind: SandboxRemoval = SandboxRemoval.ENFORCED,
    ) -> None:
        """Stop the container of a misbehaving sandbox; the next call recreates it.

        ``tell``: say so in this call's result (not when the call goes on in a fresh sandbox,
        whose own notice says it all).
        """
        if tell and self._live is live:
            report_notice(
                f"the sandbox was removed ({reason}); the next call gets a fresh one, without this"
                " one's /tmp files and processes"
            )
        await self._discard(live, reason, kind)

    def _too_old(self, live: LiveContainer, now: float) -> bool:
        return live.older_than(self._provider.config.max_lifetime_seconds, now)

    async def _retire(self, live: LiveContainer) -> None:
        """Remove a container past ``max_lifetime_seconds`` (not a failure: no recreation counted)."""
        lifetime = self._provider.config.max_lifetime_seconds
        await self._discard(
            live, f"it had reached the sandbox's maximum lifetime ({lifetime:g} s)", SandboxRemoval.LIFETIME
        )
        self.recreations -= 1

    async def retire_if_idle(self, now: float, ttl: float) -> bool:
        """Remove the container after ``ttl`` seconds without calls, unless processes still run
        in it (a background test run is work, not idleness), or once it is older than
        ``max_lifetime_seconds`` while no call runs, processes or not; True if it did."""
        live = self._live
        if live is not None and not self._active and self._too_old(live, now):
            async with self._lock:
                if self._live is live and not self._active:
                    await self._retire(live)
                    return True
            return False
        if live is None or self._active or now - self.last_used < ttl or await self._working(live):
            return False
        async with self._lock:
            if self._live is not live or self._active or now - self.last_used < ttl:
                return False
            await self._discard(
                live, f"it had been idle for {now - self.last_used:.0f} s", SandboxRemoval.IDLE
            )
            self.recreations -= 1  # idleness is not a failure
            return True

    async def _working(self, live: LiveContainer) -> bool:
        """True while processes that commands started still run (asked of the agent)."""
        if live.channel is None or live.broken:
            return False  # no agent to ask (docker exec fallback) or a dead one: nothing to spare
        try:
            processes, _, _ = await asyncio.wait_for(
                # An MCP server the session runs here is not work: it may wait for calls forever.
                live.channel.procs(spare_exec_sessions=True),
                self._provider.config.op_timeout_seconds,
            )
        except (TimeoutError, SandboxError, FileOpError) as exc:
            log.warning("session %s: cannot count its processes: %s", self.session.session_id, exc)
            return False
        return processes > 0

    def _replaced(self, reason: str) -> None:
        self.generation += 1
        self.last_removal = reason

    def container_died(self, container_id: str) -> None:
        """Its host says the container stopped by itself (gVisor's sandbox dies when a fork bomb takes
        the pids its own threads need, and the agent's exec stream may stay open): break the
        channel now, so the next call recreates the sandbox instead of waiting for a dead agent."""
        live = self._live
        if live is not None and live.container_id == container_id and live.channel is not None:
            live.channel.abort("the sandbox's container stopped")

    async def detach(self) -> None:
        """Close the agent channel but leave the container running (the session is kept)."""
        if self._processes is not None:
            self._processes.close()
        async with self._lock:
            self._closed = True
            live, self._live = self._live, None
            if live is not None:
                if live.channel is not None:
                    with contextlib.suppress(Exception):
                        await live.channel.close()
                if live.stream is not None:
                    live.stream.close()

    async def close(self) -> None:
        """Remove the container (session closed or server stopping)."""
        if self._processes is not None:
            self._processes.close()
        async with self._lock:
            self._closed = True
            if self._live is not None:
                live, self._live = self._live, None
                await self._provider.destroy(live)

    # -- exec ----------------------------------------------------------------------------

    async def exec(
        self, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
    ) -> ExecResult:
        """See ``Sandbox.exec``: through the agent, guarded (``exec_guard.run_command``)."""
        result = await run_command(self, request, on_output, cancel_event)
        if result.left:
            self._agent_processes().saw_left(result.left)
        return result

    # -- file operations (guarded: ``file_guard.py``) -----------------------------------------

    async def _file_op(self, what: str, op: Callable[[AgentChannel], Awaitable[T]]) -> T:
        return await guarded_file_op(self, what, op)

    def agent_channel(self, what: str) -> AbstractAsyncContextManager[AgentChannel]:
        """The live agent channel held for one long operation (a tree transfer): no op timeout,
        the container counts as busy until the block ends; a channel that broke meanwhile is
        stopped (the next call recreates the sandbox)."""
        return held_channel(self, what)

    def quota_note(self) -> str | None:
        """What to say when the workspace's disk is full (the tenant's quota), if anything."""
        return self._provider.quota_note(self.session.tenant_id)

    async def connect_port(self, port: int) -> PortStream:
        """See ``Sandbox.connect_port``: through the agent's channel, no port of the container or
        Pod published. The container counts as in use only while connecting: a connection held
        open (a WebSocket) must not keep a container past its lifetime, whose retirement waits
        for the calls in it; a container retired or lost ends its connections with its channel."""
        check_port(port)
        async with self.agent_channel(f"a connection to port {port}") as channel:
            return await channel.connect_port(port)

    def processes(self) -> ProcessControl:
        """The session's process table, in its container's agent (``container/processes.py``)."""
        return self._agent_processes()

    def _agent_processes(self) -> AgentProcesses:
        if self._processes is None:
            self._processes = AgentProcesses(ContainerProcessHost(self))
        return self._processes

    async def start_process(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], *, limit: int
    ) -> AttachedProcess:
        """See ``Sandbox.start_process``: in the session's container (created if it is not running),
        which counts as in use while the process is set up."""
        async with self.using() as live:
            return await self._provider.start_process(live, self.session, argv, env, limit=limit)
