"""Giving a restarted server its sessions' containers back instead of reaping them.

A container is adopted only when everything agrees: it carries this instance's label and the
session's and tenant's labels, its id is the one the session's stored state names, and it still
runs (each host checks its own listing: ``docker/orphans.py``, ``kubernetes/pods.py``). A fresh
agent is then started in it (or, on a Pod, attached again), so only the server ever talks to it.
Anything else is removed, and the session's next call gets a fresh sandbox whose result says why.

``reattach`` starts that agent; ``Adoption`` is a sandbox's side of it: the container it expects,
the one the start-up sweep finds by its labels, re-attached in the background or by the first call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.host import ContainerHost, LiveContainer

log = logging.getLogger(__name__)

GONE = "its container was gone when the server restarted"


async def reattach(host: ContainerHost, session: Session, container_id: str) -> LiveContainer | str:
    """Start a new agent in the session's running container; a string says why that failed (the
    container is then removed)."""
    try:
        link = await host.start_agent(container_id, session)
    except (SandboxError, ConnectionError, OSError) as exc:
        log.warning(
            "session %s: re-attaching container %s failed: %s", session.session_id, container_id[:12], exc
        )
        with contextlib.suppress(Exception):
            await host.remove_container(container_id)
        return f"its agent could not be re-attached after the server restarted ({exc})"
    log.info("session %s: re-adopted container %s", session.session_id, container_id[:12])
    if link is None:
        return LiveContainer(container_id, None, None, started=host.clock())
    return LiveContainer(container_id, link[0], link[1], started=host.clock())


class Adoption:
    """A container sandbox's side of a restart: the container a previous server life started for
    its session, expected, found by the start-up sweep, re-attached or given up. Mixed into
    ``ContainerSandbox``, which sets the state below and supplies ``_replaced``."""

    session: Session
    _provider: ContainerHost
    _lock: asyncio.Lock
    _live: LiveContainer | None
    _closed: bool
    _lost: str | None
    last_used: float
    _adopt: str | None
    _adopt_started: float | None
    unstored: bool

    def _replaced(self, reason: str) -> None:
        """Count the session's container as replaced, for ``reason``."""
        raise NotImplementedError

    @property
    def adopting(self) -> str | None:
        """The container id this sandbox is to re-adopt, until it has (or has given up)."""
        return self._adopt

    def expect(self, container_id: str) -> None:
        self._adopt = container_id

    def expect_labelled(self) -> None:
        """A restarted server gives the session back with no stored container: the server may have
        died between launching it and storing its id. The start-up sweep looks for one by its
        labels (``found``)."""
        if self._adopt is None and self._live is None:
            self.unstored = True

    def found(self, container_id: str) -> None:
        """The sweep found the session's container by its labels: re-adopt it, and store its id."""
        self.unstored = False
        self._adopt = container_id
        self._provider.container_changed(self.session.session_id, container_id)

    def adoptable(self, created: float) -> None:
        """The expected container passed its checks; it was created at ``created`` (epoch s)."""
        self._adopt_started = self._provider.clock() - max(0.0, time.time() - created)

    def adoption_failed(self, reason: str) -> None:
        """The expected container cannot be re-adopted: the next call starts a fresh one and says why."""
        if self._adopt is not None:
            self._adopt = None
            self._lost = reason
            self._replaced(reason)
            self._provider.container_changed(self.session.session_id, None)

    async def adopt(self) -> None:
        """Re-attach the expected container now (a no-op once done; the caller bounds how many at
        once, ``adopt_all``). One a call holds is left to the call, which re-attaches the container
        itself (``_usable``) in a slot of its own."""
        if self._adopt is None or self._lock.locked():
            return
        async with self._lock:
            await self._adopt_locked()

    async def _adopt_locked(self) -> None:
        container_id, self._adopt = self._adopt, None
        if container_id is None or self._live is not None or self._closed:
            return
        result = await reattach(self._provider, self.session, container_id)
        if isinstance(result, str):
            self._lost = result
            self._replaced(result)
            self._provider.container_changed(self.session.session_id, None)
        else:
            if self._adopt_started is not None:
                result.started = self._adopt_started
            self._live = result
            self.last_used = self._provider.clock()
