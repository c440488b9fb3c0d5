"""The warm pool's filler: the background loop that makes its containers, one at a time, for the
keys its shares call for, up to its size and never past it; after a failure it waits and tries again.

Each container is made for a session id not yet handed out (its labels are fixed at creation) with
an empty slot bound at ``/workspace`` (``adopt.py``) and its agent answering. What it made goes to
the ledger (``ledger.py``): to the session that reserved it meanwhile, or to wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import new_session_id
from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.container.labels import (
    LABEL_POOL,
    LABEL_SESSION,
    LABEL_SPEC,
    LABEL_TENANT,
    pool_fingerprint,
)
from dispatcher.sandbox.docker.agent.listener import LABEL_AGENT_LINK
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.launch import ContainerLauncher
from dispatcher.sandbox.docker.pool.adopt import SlotMounts
from dispatcher.sandbox.docker.pool.ledger import Ledger, Pooled
from dispatcher.sandbox.docker.pool.shares import Key, Shares
from dispatcher.sandbox.launch_slots import LaunchSlots, in_background

log = logging.getLogger(__name__)

FILLS_AT_ONCE = 1
"""Containers the pool makes at once: making one costs a few hundred ms of dockerd, containerd and
runc CPU, which sessions being adopted (and every running call) need more; refilling one at a time
leaves the other launch slots to sessions that launch their own."""
RETRY_SECONDS = 5.0
"""After a failed fill, how long the pool waits before trying again (a missing image, a full disk)."""


class Filler:
    """Makes containers until those waiting and being made (for no session yet) reach the size."""

    def __init__(
        self,
        ledger: Ledger,
        shares: Shares,
        launcher: ContainerLauncher,
        api: DockerAPI,
        mounts: Callable[[], SlotMounts],
        slots_dir: str,
        *,
        launch_slots: LaunchSlots,
        discard: Callable[[Pooled], Awaitable[None]],
        report: Callable[[], None],
        closed: Callable[[], bool],
    ) -> None:
        self._ledger = ledger
        self._shares = shares
        self._launcher = launcher
        self._config = launcher.config
        self._api = api
        self._mounts = mounts
        """The pool's slot mounts (read at each use: tests put fakes in)."""
        self._slots_dir = slots_dir
        self._launch_slots = launch_slots
        self._discard = discard
        self._report = report
        self._closed = closed
        self.started = False
        self._retry: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        """Fills, and removals the pool started in the background."""

    def background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def kick(self) -> None:
        """Start making containers until ready + being made (for no session yet) reaches the size
        (counted at once, so a session that asks next reserves one of these instead of launching
        its own)."""
        if not self.started or self._closed() or self._retry is not None:
            return
        while len(self._ledger.making) < FILLS_AT_ONCE and (key := self._next_key()) is not None:
            session_id = new_session_id()
            self._ledger.making[session_id] = key
            self.background(self._fill(key, session_id), "sandbox-warm-pool-fill")

    async def stop(self) -> None:
        """Make nothing more; let the fills under way end (each discards what it made, the pool
        being closed) within the agent's deadline: one cancelled mid-attach would leave its exec
        stream open."""
        if self._retry is not None:
            self._retry.cancel()
        if self.tasks:
            _, late = await asyncio.wait(set(self.tasks), timeout=self._config.agent_start_timeout + 5)
            for task in late:
                task.cancel()

    def _next_key(self) -> Key | None:
        """The key to make the next container for, or None when the pool is full."""
        ledger = self._ledger
        if ledger.waiting + ledger.unclaimed_making() >= self._shares.size:
            return None
        targets = self._shares.targets()
        if not targets:
            return None
        have = {k: len(ledger.ready.get(k, ())) + ledger.unclaimed_making(k) for k in targets}
        key = max(targets, key=lambda k: targets[k] - have[k])
        return key if targets[key] > have[key] else None

    def _retry_later(self) -> None:
        self._retry = None
        self.kick()

    async def _fill(self, key: Key, session_id: str) -> None:
        try:
            with in_background():  # a call that needs a container goes first
                async with self._launch_slots.take():
                    pooled = await self._make(key, session_id)
        except asyncio.CancelledError:
            self._ledger.filled(session_id)
            raise
        except Exception as exc:
            log.warning("filling the warm pool failed (trying again in %g s): %s", RETRY_SECONDS, exc)
            if self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(RETRY_SECONDS, self._retry_later)
            self._ledger.filled(session_id)
            return
        if self._closed() or session_id in self._ledger.dropped:
            self._ledger.filled(session_id)
            await self._discard(pooled)
            self.kick()  # its session left: make one for the next
            return
        self._ledger.made(pooled)
        self._ledger.filled(session_id)
        self._report()
        self.kick()  # a key asked for meanwhile may still lack one

    async def _make(self, key: Key, session_id: str) -> Pooled:
        tenant, user = key
        loop = asyncio.get_running_loop()
        slot = await loop.run_in_executor(None, self._mounts().make, self._slots_dir)
        container_id: str | None = None
        listener = None
        try:
            listener = await loop.run_in_executor(None, self._launcher.listen)
            mounts = [
                {
                    "Type": "bind",
                    "Source": slot,
                    "Target": WORKSPACE_ROOT,
                    "ReadOnly": False,
                    "BindOptions": {"Propagation": "rslave"},
                }
            ]
            labels = {
                LABEL_POOL: "1",
                LABEL_SESSION: session_id,
                LABEL_TENANT: tenant,
                LABEL_SPEC: pool_fingerprint(self._config, user),
            }
            if listener is not None:
                mounts.append(listener.mount)
                labels[LABEL_AGENT_LINK] = listener.name
            spec = self._launcher.spec(user, labels, mounts)
            container_id = await self._api.create_container(self._launcher.container_name(session_id), spec)
            if listener is not None:
                self._launcher.sockets.made(container_id, listener)
            await self._api.start(container_id)
            link = await self._launcher.attach_agent(container_id, user, [], listener=listener)
            if link is None:
                raise SandboxError("the image cannot run the agent: no warm pool without it")
            return Pooled(container_id, link, slot, key, session_id)
        except BaseException:
            if container_id is not None:
                with contextlib.suppress(Exception):
                    await self._api.remove(container_id)
                self._launcher.sockets.forget(container_id)
            elif listener is not None:
                self._launcher.sockets.discard(listener)
            await loop.run_in_executor(None, self._mounts().release, slot)
            raise
        finally:
            if listener is not None:
                listener.close()
