"""The Docker provider's watch over its running containers: the deaths Docker reports, and whether
a container still runs after its agent's channel failed.

The death watch starts with the provider's first sandbox and stops with it (the idle reaper, the
same for every host, is the provider base's: ``container/provider.py``). It reads Docker's event
stream of this instance's container deaths on a thread (the stream blocks) and breaks the dead
container's channel at once, so its next call recreates the sandbox instead of waiting for an agent
that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.labels import LABEL_INSTANCE
from dispatcher.sandbox.docker.client import DockerAPI

if TYPE_CHECKING:
    from dispatcher.sandbox.container.sandbox import ContainerSandbox

log = logging.getLogger(__name__)


class DeathWatch:
    """The container-death thread of one provider."""

    def __init__(
        self,
        api: DockerAPI,
        instance: str,
        *,
        sandboxes: Callable[[], list[ContainerSandbox]],
        closed: Callable[[], bool],
    ) -> None:
        self._api = api
        self._instance = instance
        self._sandboxes = sandboxes
        """The provider's sandboxes now (it replaces its table when it lets them all go)."""
        self._closed = closed
        """Whether the provider is closed (then a failing event stream is no news)."""
        self._deaths: Any = None  # the Docker event stream of this instance's container deaths

    def start(self) -> None:
        """Start the watch, once; outside a running loop: nothing yet (the first async call
        starts it)."""
        if self._deaths is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # sandbox_for() called outside a loop; the first async call starts it
        self._deaths = False  # once
        threading.Thread(target=self._watch_deaths, args=(loop,), name="docker-deaths", daemon=True).start()

    def close(self) -> None:
        """Close the event stream (ending the thread)."""
        if self._deaths:
            with contextlib.suppress(Exception):
                self._deaths.close()

    def _watch_deaths(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tell each sandbox when Docker reports its container dead (runs on its own thread: the
        event stream blocks; ``close`` closes it)."""
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
        except Exception as exc:  # closed by close, or a daemon gone: calls still time out
            if not self._closed():
                log.warning("watching container deaths stopped: %s", exc)

    def _container_died(self, container_id: str) -> None:
        for sandbox in self._sandboxes():
            sandbox.container_died(container_id)


async def still_running(api: DockerAPI, container_id: str, settle: float = 5.0) -> bool:
    """Whether Docker still runs the container, asked only after a channel failed; the channel's
    end can come before Docker has noticed the death, so it is given ``settle`` s."""
    deadline = time.monotonic() + settle
    while True:
        try:
            info = await api.inspect(container_id)
        except SandboxError:
            return False
        if not (info.get("State") or {}).get("Running"):
            return False
        if time.monotonic() >= deadline:
            return True
        await asyncio.sleep(0.05)
