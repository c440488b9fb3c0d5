"""What a container provider does with its sessions' sandboxes, whatever runs the containers.

The Docker and the Kubernetes providers both hand out one ``DockerSandbox`` per session over their
own ``ContainerHost``; starting it at creation, re-adopting it after a restart, letting go of it at a
graceful stop, pausing and resuming it are the same for both, so they live here once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from dispatcher.core.sandbox_api import ProviderLifecycle
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.sandbox.docker.sandbox import DockerSandbox
from dispatcher.sandbox.launch_slots import LaunchSlots, in_background

if TYPE_CHECKING:
    from dispatcher.core.sessions.registry import Restoration
    from dispatcher.core.sessions.state import SessionState
    from dispatcher.sandbox.docker.config import SandboxConfig

log = logging.getLogger(__name__)


class SessionSandboxes(ProviderLifecycle):
    """The session side of a container provider; the provider sets the attributes below."""

    config: SandboxConfig
    _sandboxes: dict[str, DockerSandbox]
    _starting: set[asyncio.Task[None]]
    """Sandboxes started at session creation (``start_on_create``), until they are up."""
    _closed: bool
    _launch_slots: LaunchSlots
    """A few launches (and re-adoptions) at a time: all at once, every agent misses its deadline."""

    def session_created(self, session: Session) -> None:
        """With ``start_on_create``: start the session's sandbox now, in the background (a
        failure is logged; the first call starts it again and reports it)."""
        if not self.config.start_on_create or self._closed:
            return
        # The handle now, so a CloseSession that comes first closes this very sandbox.
        sandbox = self.sandbox_for(session)
        task = asyncio.get_running_loop().create_task(_start(sandbox), name="sandbox-start")
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def sandbox_for(self, session: Session) -> DockerSandbox:
        raise NotImplementedError

    def expect_container(self, session: Session, container_id: str) -> None:
        """A restarted server gives ``session`` back: ``container_id`` (its stored container) is
        kept by ``remove_orphans`` and re-adopted by ``adopt_all`` or the session's first call."""
        self.sandbox_for(session).expect(container_id)

    async def adopt_all(self) -> None:
        """Re-attach every expected container now (a few at a time), so that idle expiry and
        process counts work on them as on any other; a paused session's stays as it is until it is
        resumed, and a call of a session still waiting re-attaches its own container itself."""
        waiting = [s for s in self._sandboxes.values() if s.adopting and not s.paused]

        async def one(sandbox: DockerSandbox) -> None:
            # The slot first, then the sandbox's lock: a call of a session still waiting here
            # re-attaches its own container at once instead of queueing behind the others, and a
            # call that needs a new container takes the next slot before any of these.
            with in_background():
                async with self._launch_slots.take():
                    await sandbox.adopt()

        await asyncio.gather(*(one(s) for s in waiting), return_exceptions=True)

    async def detach_all(self) -> None:
        """Let go of every container without removing it (a graceful stop that keeps sessions):
        the agents exit or wait as their streams close; what commands left running keeps running."""
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        await asyncio.gather(*(s.detach() for s in sandboxes), return_exceptions=True)

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        """Re-adopt its container; a session paused before the restart stays paused."""
        super().session_restored(state, restored)
        if state.status is SessionStatus.PAUSED:
            self.sandbox_for(state.session).paused = True

    async def pause(self, session_id: str) -> None:
        sandbox = self._sandboxes.get(session_id)
        if sandbox is not None:
            await sandbox.pause()

    async def resume(self, session_id: str, *, notice: str | None = None) -> None:
        sandbox = self._sandboxes.get(session_id)
        if sandbox is not None:
            await sandbox.resume(notice)

    async def working(self, session_id: str) -> bool:
        sandbox = self._sandboxes.get(session_id)
        return sandbox is not None and await sandbox.working()

    async def close_all(self) -> None:
        """Close every sandbox (its container removed); one that fails is logged, not raised."""
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        for result in await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("closing a sandbox failed: %s", result)


async def _start(sandbox: DockerSandbox) -> None:
    try:
        with in_background():  # nobody waits for it yet: a call's launch goes first
            async with sandbox.using():
                pass
    except Exception as exc:  # the first call tries again and says why
        log.info("starting session %s's sandbox at creation failed: %s", sandbox.session.session_id, exc)
