"""What a container provider is, whatever runs the containers: the base both hosts extend.

The Docker and the Kubernetes providers both hand out one ``ContainerSandbox`` per session over
their own ``ContainerHost`` (the provider is its sandboxes' host); handing it out, starting it at
creation, re-adopting it after a restart, letting go of it at a graceful stop, pausing and resuming
it, and retiring it when idle or too old are the same for both, so they live here once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from dispatcher.core.observe import SandboxFailure
from dispatcher.core.provider_api import NO_HOOKS, ProviderHooks, SandboxProvider
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.host import ContainerHost
from dispatcher.sandbox.container.image import AgentVersionMismatch, ImageUnusable
from dispatcher.sandbox.container.sandbox import ContainerSandbox
from dispatcher.sandbox.launch_slots import LaunchSlots, in_background

if TYPE_CHECKING:
    from dispatcher.core.sessions.registry import Restoration
    from dispatcher.core.sessions.state import SessionState

log = logging.getLogger(__name__)
T = TypeVar("T")

ADOPTIONS_PER_LAUNCH_SLOT = 4
"""Agents calls may start at once in containers kept across a restart, per launch slot; the
background sweep starts its own, as many as there are launch slots, beside them. Starting an
agent in a running container is one ``docker exec`` and a Python start, a fraction of a launch.
Measured with 100 sessions after a restart on a 2-core machine: a sweep as wide as this bound
made a session's first call wait 9-10 s (its agent start shared the CPU with 15 others); calls
and the sweep in the same 4 slots made the last session answer after 24-31 s."""


class ContainerProvider(SandboxProvider, ContainerHost):
    """The session side of a container provider; a host adds what running a container takes."""

    def __init__(self, config: SandboxConfig, *, instance: str, hooks: ProviderHooks = NO_HOOKS) -> None:
        self.config = config
        self.instance = config.instance or instance
        if not self.instance:
            raise ValueError("instance must be a non-empty string")
        self._sandboxes: dict[str, ContainerSandbox] = {}
        self._starting: set[asyncio.Task[None]] = set()
        """Sandboxes started at session creation (``start_on_create``), until they are up."""
        self._closed = False
        self._launch_slots = LaunchSlots(config.max_concurrent_launches)
        """A few launches at a time: a burst of new sessions launched all at once on a small
        machine makes every agent miss its start deadline."""
        self._adoption_slots = LaunchSlots(ADOPTIONS_PER_LAUNCH_SLOT * config.max_concurrent_launches)
        """Agents calls start in containers kept across a restart, a bounded number at a time (a
        thousand sessions' first calls must not start a thousand at once)."""
        self._reaper: asyncio.Task[None] | None = None
        self.clock: Callable[[], float] = time.monotonic
        """What containers' ages and idleness are measured on (unit tests step a fake clock)."""
        self.take_hooks(hooks)  # observer: each launch, failure and removal; on_container: stored

    def sandbox_for(self, session: Session) -> ContainerSandbox:
        """The session's sandbox handle; no container exists until its first call (or its start
        at creation)."""
        if self._closed:
            raise SandboxError("the sandbox provider is closed")
        sandbox = self._sandboxes.get(session.session_id)
        if sandbox is None:
            sandbox = self._sandboxes[session.session_id] = ContainerSandbox(self, session)
        self._watch()
        return sandbox

    def container_changed(self, session_id: str, container_id: str | None) -> None:
        if self.on_container is not None:
            self.on_container(session_id, container_id)

    async def _launch_counted(self, launch_once: Callable[[], Awaitable[T]]) -> T:
        """``launch_once`` in a launch slot, once more if it failed (nothing has run in the sandbox
        yet, so another try is safe; not when the image is what failed: another try meets the same
        image); its duration, or why it failed, told to the observer."""
        async with self._launch_slots.take():
            started = time.monotonic()
            try:
                try:
                    launched = await launch_once()
                except (AgentVersionMismatch, ImageUnusable):
                    raise
                except SandboxError as exc:
                    log.warning("sandbox launch failed, retrying once: %s", exc)
                    launched = await launch_once()
            except Exception as exc:
                self.observer.sandbox_failed(launch_failure(exc))
                raise
            self.observer.sandbox_launched(time.monotonic() - started)
            return launched

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

    def expect_container(self, session: Session, container_id: str) -> None:
        """A restarted server gives ``session`` back: ``container_id`` (its stored container) is
        kept by ``remove_orphans`` and re-adopted by ``adopt_all`` or the session's first call."""
        self.sandbox_for(session).expect(container_id)

    def adoption_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._adoption_slots.take()

    async def adopt_all(self) -> None:
        """Re-attach every expected container now, as many at a time as there are launch slots
        (behind every call's launch), so that idle expiry and process counts work on them as on
        any other; a paused session's stays as it is until it is resumed. A call of a session
        still waiting here re-attaches its own container in an adoption slot, which this sweep
        never takes (``ContainerSandbox._usable``)."""
        waiting = [s for s in self._sandboxes.values() if s.adopting and not s.paused]

        async def one(sandbox: ContainerSandbox) -> None:
            with in_background():
                async with self._launch_slots.take():  # the sweep's own bound: a few at a time
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
        """Stop the reaper and the starts under way, then close every sandbox (its container
        removed); one that fails is logged, not raised."""
        for task in (self._reaper, *self._starting):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        for result in await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("closing a sandbox failed: %s", result)

    # -- idle and lifetime retirement --------------------------------------------------------

    def _watch(self) -> None:
        """Start the idle reaper (again, if it ended); outside a running loop: nothing yet (the
        first async call starts it). A host that watches more extends this."""
        if self._reaper is not None and not self._reaper.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # sandbox_for() called outside a loop; the first async call starts it
        self._reaper = loop.create_task(self._reap_idle(), name="sandbox-idle-reaper")

    async def _reap_idle(self) -> None:
        """Ask each sandbox, a few times per idle TTL (or lifetime, if shorter), to retire its
        container when idle or too old (``ContainerSandbox.retire_if_idle``); a paused session's
        frozen container is neither."""
        ttl = self.config.idle_ttl_seconds
        shortest = min(ttl, self.config.max_lifetime_seconds or ttl)
        interval = min(max(shortest / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            now = self.clock()
            for sandbox in list(self._sandboxes.values()):
                if sandbox.paused:
                    continue  # frozen on purpose: neither idle nor too old until it resumes
                try:
                    # Shielded: a stop (which cancels this task) waits for a removal under way, on
                    # the sandbox's lock, instead of leaving it half done.
                    await asyncio.shield(sandbox.retire_if_idle(now, ttl))
                except Exception as exc:  # one failing removal must not stop the reaper
                    log.warning("idle removal of session %s failed: %s", sandbox.session.session_id, exc)


def launch_failure(exc: BaseException) -> SandboxFailure:
    """The metrics' reason for a launch that failed (a closed set: never the message)."""
    if isinstance(exc, AgentVersionMismatch):
        return SandboxFailure.AGENT_VERSION
    if isinstance(exc, ImageUnusable):
        return SandboxFailure.IMAGE
    return SandboxFailure.LAUNCH


async def _start(sandbox: ContainerSandbox) -> None:
    try:
        with in_background():  # nobody waits for it yet: a call's launch goes first
            async with sandbox.using():
                pass
    except Exception as exc:  # the first call tries again and says why
        log.info("starting session %s's sandbox at creation failed: %s", sandbox.session.session_id, exc)
