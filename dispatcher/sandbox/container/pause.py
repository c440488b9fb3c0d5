"""A container sandbox's session paused: its container frozen (``docker pause``; a Pod's processes
stopped) and thawed, or held still for the length of a block (a snapshot's copy), and what counts
as work in it meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dispatcher.core.observe import SandboxRemoval
from dispatcher.sandbox.container.adopt import Adoption
from dispatcher.sandbox.container.host import ContainerNotFound, LiveContainer


class Pausing(Adoption):
    """Pause, resume and hold still a session's container, the one running or the one a restart
    expects. Mixed into ``ContainerSandbox``, which sets the state below and supplies ``_discard``
    and ``_working``."""

    _thawed: asyncio.Event
    _resumed: str | None
    _active: int

    async def _discard(self, live: LiveContainer, reason: str, kind: SandboxRemoval) -> None:
        """Forget ``live`` and remove its container, unless a newer one already replaced it."""
        raise NotImplementedError

    async def _working(self, live: LiveContainer) -> bool:
        """True while processes that commands started still run (asked of the agent)."""
        raise NotImplementedError

    @property
    def paused(self) -> bool:
        """Its session is paused: the container is frozen (idle and lifetime retirement skip it)."""
        return not self._thawed.is_set()

    @paused.setter
    def paused(self, paused: bool) -> None:
        if paused:
            self._thawed.clear()
        else:
            self._thawed.set()

    async def thawed(self) -> None:
        """Return once the session is not paused."""
        await self._thawed.wait()

    async def pause(self) -> None:
        """Freeze the container (``docker pause``; a Pod's processes stopped): processes and /tmp
        kept, no CPU used."""
        async with self._lock:
            self.paused = True
            container_id = self._live.container_id if self._live is not None else self._adopt
            if container_id is not None:
                await self._provider.freeze(container_id)

    @contextlib.asynccontextmanager
    async def held_still(self) -> AsyncIterator[str | None]:
        """Its container frozen for the block (one already paused stays so), under the lock, so
        no container is launched or replaced meanwhile; yields its id, None when none runs.

        Raises:
            ContainerNotFound: the container is gone (the next call starts another).
        """
        async with self._lock:
            container_id = self._live.container_id if self._live is not None else self._adopt
            if container_id is None:
                yield None
                return
            froze = not self.paused
            if froze:
                await self._provider.freeze(container_id)
            try:
                yield container_id
            finally:
                if froze:
                    await self._provider.thaw(container_id)

    async def resume(self, notice: str | None) -> None:
        """Thaw the container; one removed meanwhile (``docker rm``) is handled as any vanished
        one: the next call gets a fresh sandbox and says why."""
        async with self._lock:
            self.paused = False
            live = self._live
            container_id = live.container_id if live is not None else self._adopt
            if container_id is None:
                return
            try:
                await self._provider.thaw(container_id)
            except ContainerNotFound:
                reason = "its container was removed while the session was paused"
                if live is not None:
                    await self._discard(live, reason, SandboxRemoval.DIED)
                else:
                    self.adoption_failed(reason)
                return
            self._resumed = notice

    async def working(self) -> bool:
        """Processes still run in the container (a frozen one: none run)."""
        if self._adopt is not None:
            return not self.paused  # not re-attached yet: cannot tell, so it is not idle
        live = self._live
        if live is None or self.paused or self._active:
            return self._active > 0
        return await self._working(live)
