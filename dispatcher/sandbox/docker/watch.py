"""The Docker provider's watch over its running sandboxes: idle and lifetime retirement, and
containers Docker reports dead.

Both start with the provider's first sandbox (``SandboxWatch.start``) and stop with it. The reaper
asks each sandbox, a few times per idle TTL (or lifetime, if shorter), to retire its container when
idle or too old (``DockerSandbox.retire_if_idle``); a paused session's frozen container is neither.
The death watch reads Docker's event stream of this instance's container deaths on a thread (the
stream blocks) and breaks the dead container's channel at once, so its next call recreates the
sandbox instead of waiting for an agent that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.config import LABEL_INSTANCE, SandboxConfig

if TYPE_CHECKING:
    from dispatcher.sandbox.docker.sandbox import DockerSandbox

log = logging.getLogger(__name__)


class SandboxWatch:
    """The idle reaper task and the container-death thread of one provider."""

    def __init__(
        self,
        api: DockerAPI,
        config: SandboxConfig,
        instance: str,
        *,
        sandboxes: Callable[[], list[DockerSandbox]],
        clock: Callable[[], float],
        closed: Callable[[], bool],
    ) -> None:
        self._api = api
        self._config = config
        self._instance = instance
        self._sandboxes = sandboxes
        """The provider's sandboxes now (it replaces its table when it lets them all go)."""
        self._clock = clock
        self._closed = closed
        """Whether the provider is closed (then a failing event stream is no news)."""
        self._reaper: asyncio.Task[None] | None = None
        self._deaths: Any = None  # the Docker event stream of this instance's container deaths

    def start(self) -> None:
        """Start the reaper (again, if it ended) and, once, the death watch; outside a running
        loop: nothing yet (the first async call starts them)."""
        if self._reaper is not None and not self._reaper.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # sandbox_for() called outside a loop; the first async call starts it
        self._reaper = loop.create_task(self._reap_idle(), name="sandbox-idle-reaper")
        if self._deaths is None:
            self._deaths = False  # once
            threading.Thread(
                target=self._watch_deaths, args=(loop,), name="docker-deaths", daemon=True
            ).start()

    async def aclose(self) -> None:
        """Close the event stream (ending the thread) and stop the reaper."""
        if self._deaths:
            with contextlib.suppress(Exception):
                self._deaths.close()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper

    def _watch_deaths(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tell each sandbox when Docker reports its container dead (runs on its own thread: the
        event stream blocks; ``aclose`` closes it)."""
        filters = {"type": "container", "event": "die", "label": f"{LABEL_INSTANCE}={self._instance}"}
        try:
            stream = self._api.client.events(decode=True, filters=filters)
            self._deaths = stream
            if self._closed():
                stream.close()
            for event in stream:
                cid = event.get("id") if isinstance(event, dict) else None
                if isinstance(cid, str):
                    loop.call_soon_threadsafe(self._container_died, cid)
        except Exception as exc:  # closed by aclose, or a daemon gone: calls still time out
            if not self._closed():
                log.warning("watching container deaths stopped: %s", exc)

    def _container_died(self, container_id: str) -> None:
        for sandbox in self._sandboxes():
            sandbox.container_died(container_id)

    async def _reap_idle(self) -> None:
        ttl = self._config.idle_ttl_seconds
        shortest = min(ttl, self._config.max_lifetime_seconds or ttl)
        interval = min(max(shortest / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            now = self._clock()
            for sandbox in self._sandboxes():
                if sandbox.paused:
                    continue  # frozen on purpose: neither idle nor too old until it resumes
                try:
                    # Shielded: a stop (aclose cancels this task) waits for a removal under way, on
                    # the sandbox's lock, instead of leaving it half done.
                    await asyncio.shield(sandbox.retire_if_idle(now, ttl))
                except Exception as exc:  # one failing removal must not stop the reaper
                    log.warning("idle removal of session %s failed: %s", sandbox.session.session_id, exc)
