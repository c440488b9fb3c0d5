"""The warm pool: containers created, started and with their agent answering before any session asks.

A pooled container is given its session's workspace at adoption through a slot mount, confirmed
by its agent (``pool_adopt.py``). Nothing of any session ran in a pooled container before, and an
adopted container leaves the pool for good: it is removed with its session (or its idle expiry),
never pooled again.

Keys: a container runs as one uid:gid for its whole life (its agent too), and with per-tenant uids
each tenant's sandboxes run as the tenant's own ids; so the pool is kept per sandbox user. The
``size`` is shared by all users: the pool keeps containers for the users that asked most recently
(the config's ``user`` from the start). Setting the uid at adoption instead would mean starting the
agent at adoption (tens of ms of Python start-up), which is what the pool is for.

Used only where it can keep these rules: runc (gVisor does not show host mounts made later), the
server as root (mount(2)), sessions without fs grants (their view is several mounts) and without
an egress CA bundle (mounted at creation); the session's egress listener is opened at adoption.
Other sessions launch as before. Pooled containers belong to no tenant (no quota counts them), carry
``dispatcher.pool`` and no session label (a restarted server removes them as orphans), are
refilled in the background up to ``size`` and never past it, and are removed at shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.core.observe import NO_SANDBOX_OBSERVER, SandboxObserver
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.session import Session
from dispatcher.sandbox.docker.agent_attach import AgentLink
from dispatcher.sandbox.docker.agent_socket import LABEL_AGENT_LINK
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.config import LABEL_POOL, WORKSPACE_ROOT
from dispatcher.sandbox.docker.launch import ContainerLauncher
from dispatcher.sandbox.docker.pool_adopt import SlotMounts, adopt
from dispatcher.sandbox.launch_slots import LaunchSlots, in_background

log = logging.getLogger(__name__)

FILLS_AT_ONCE = 1
"""Containers the pool makes at once: making one costs a few hundred ms of dockerd, containerd and
runc CPU, which sessions being adopted (and every running call) need more; refilling one at a time
leaves the other launch slots to sessions that launch their own."""
RETRY_SECONDS = 5.0
"""After a failed fill, how long the pool waits before trying again (a missing image, a full disk)."""


@dataclass(slots=True)
class Pooled:
    """One container of the pool (or, once adopted, of its session until it is removed)."""

    container_id: str
    link: AgentLink
    slot: str
    user: str


class WarmPool:
    """Keeps ``size`` containers ready; ``take`` hands one to a session, or None (launch as usual)."""

    def __init__(
        self,
        launcher: ContainerLauncher,
        api: DockerAPI,
        slots_dir: str,
        *,
        launch_slots: LaunchSlots,
        observer: Callable[[], SandboxObserver] = lambda: NO_SANDBOX_OBSERVER,
        mounts: SlotMounts | None = None,
    ) -> None:
        self.launcher = launcher
        self.config = launcher.config
        self.api = api
        self.size = self.config.warm_pool.size
        self._slots_dir = slots_dir
        self._launch_slots = launch_slots
        self._observer = observer
        self.mounts = mounts or SlotMounts(lambda: launcher.can_mount)
        self._ready: dict[str, deque[Pooled]] = {}
        self._filling = 0
        self._filling_for: dict[str, int] = {}  # user -> containers being made for it
        self._arrived = asyncio.Event()  # set whenever a fill ends (ready, or failed)
        self._waiting: dict[str, int] = {}  # user -> sessions waiting for one under way
        # The users of the latest takes: the pool's containers are shared among them in
        # proportion (before any, all are the config's user's).
        self._demand: deque[str] = deque(maxlen=max(1, self.size))
        self._adopted: dict[str, str] = {}  # container id -> slot, until the container is removed
        self._started = False
        self._retry: asyncio.TimerHandle | None = None
        self._fills: set[asyncio.Task[None]] = set()
        self._closed = False
        self.hits = 0
        self.misses = 0

    @property
    def ready(self) -> int:
        """Containers waiting now."""
        return sum(len(q) for q in self._ready.values())

    def usable_for(self, session: Session) -> bool:
        """Whether this session may adopt a pooled container (see the module docstring)."""
        caps = session.capabilities
        return (
            self.size > 0
            and not self._closed
            and self.mounts.available()
            and self.config.runtime in (None, "runc")
            and (caps is None or caps.fs_grants is None)
            # The tenant's egress CA bundle is mounted at creation: such sessions launch as before.
            and not self.launcher.needs_ca(session)
        )

    def start(self) -> None:
        """Remove slots a previous run left mounted, then fill in the background (after the
        start-up sweep of orphans, which would remove pooled containers)."""
        if self.size <= 0 or self._started or not self.mounts.available():
            return
        self._started = True
        self.mounts.release_stale(self._slots_dir)
        self._kick()

    async def take(self, session: Session) -> Pooled | None:
        """A ready container with the session's workspace mounted and confirmed, or None."""
        user = self.config.user_for(session.sandbox_uid, session.sandbox_gid)
        self._want(user)
        queue = await self._ready_for(user)
        if not queue:
            self.misses += 1
            self._observer().pool_taken(False, 0.0)
            return None
        pooled = queue.popleft()
        self._report()
        self._kick()
        started = time.monotonic()
        try:
            self._adopted[pooled.container_id] = pooled.slot
            await adopt(
                self.launcher,
                self.mounts,
                session,
                container_id=pooled.container_id,
                slot=pooled.slot,
                link=pooled.link,
            )
        except Exception as exc:
            log.warning("adopting a warm pool's container failed, launching one instead: %s", exc)
            await self.discard(pooled)
            self.misses += 1
            self._observer().pool_taken(False, 0.0)
            return None
        self.hits += 1
        took = time.monotonic() - started
        self._observer().pool_taken(True, took)
        log.debug(
            "session adopted a warm pool's container",
            extra={
                "session_id": session.session_id,
                "container": pooled.container_id[:12],
                "ms": took * 1000,
            },
        )
        return pooled

    async def _ready_for(self, user: str) -> deque[Pooled] | None:
        """The user's waiting containers; when there are none but one is being made for the user
        that no other session waits for, wait for it (a launch of the session's own would take no
        less, and would compete with it for the launch slots)."""
        if self._ready.get(user) or self._waiting.get(user, 0) >= self._filling_for.get(user, 0):
            return self._ready.get(user)  # ready, or every container under way is spoken for
        self._waiting[user] = self._waiting.get(user, 0) + 1
        try:
            deadline = asyncio.get_running_loop().time() + self.config.agent_start_timeout + 5
            while not self._ready.get(user) and self._filling_for.get(user) and not self._closed:
                self._arrived.clear()
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), remaining)
        finally:
            self._waiting[user] -= 1
        return self._ready.get(user)

    def owns(self, container_id: str) -> bool:
        """Whether the container is the pool's (waiting or adopted, until it is removed)."""
        return container_id in self._adopted or any(
            p.container_id == container_id for q in self._ready.values() for p in q
        )

    async def removed(self, container_id: str) -> None:
        """An adopted container was removed: unmount and remove its slot."""
        slot = self._adopted.pop(container_id, None)
        if slot is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.mounts.release, slot)

    async def discard(self, pooled: Pooled) -> None:
        """Remove a pooled container and its slot (failed adoption, shutdown)."""
        with contextlib.suppress(Exception):
            await pooled.link[1].close()
        pooled.link[0].close()
        with contextlib.suppress(Exception):
            await self.api.remove(pooled.container_id)
        self.launcher.sockets.forget(pooled.container_id)
        self._adopted.pop(pooled.container_id, None)
        await asyncio.get_running_loop().run_in_executor(None, self.mounts.release, pooled.slot)

    async def aclose(self) -> None:
        """Stop filling and remove every waiting container (adopted ones go with their sessions)."""
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
        if self._fills:
            # A fill cancelled mid-attach would leave its exec stream open: let those under way
            # finish (each discards what it made, the pool being closed), within the agent's deadline.
            _, late = await asyncio.wait(set(self._fills), timeout=self.config.agent_start_timeout + 5)
            for task in late:
                task.cancel()
        waiting = [p for q in self._ready.values() for p in q]
        self._ready.clear()
        await asyncio.gather(*(self.discard(p) for p in waiting), return_exceptions=True)
        self._report()

    # -- filling ----------------------------------------------------------------------------

    def _want(self, user: str) -> None:
        """Count a take by ``user``; waiting containers of users now past their share are removed
        (only waiting ones: never one being made or adopted), so the refill makes ``user``'s."""
        self._demand.append(user)
        targets = self._targets()
        surplus: list[Pooled] = []
        for other, queue in self._ready.items():
            keep = max(0, targets.get(other, 0) - self._filling_for.get(other, 0))
            surplus.extend(list(queue)[keep:])
        for pooled in surplus:
            self._ready[pooled.user].remove(pooled)
            task = asyncio.get_running_loop().create_task(
                self.discard(pooled), name="sandbox-warm-pool-evict"
            )
            self._fills.add(task)
            task.add_done_callback(self._fills.discard)
        if surplus:
            self._report()
        self._kick()

    def _targets(self) -> dict[str, int]:
        """Containers per user: the size shared in proportion to the latest takes (largest
        remainders first, ties to the most recent user)."""
        if not self._demand:
            return {self.config.user: self.size}
        counts: dict[str, int] = {}
        for user in reversed(self._demand):  # most recent first: ties go to it
            counts[user] = counts.get(user, 0) + 1
        total = len(self._demand)
        targets = {u: self.size * c // total for u, c in counts.items()}
        left = self.size - sum(targets.values())
        for user in sorted(counts, key=lambda u: -(self.size * counts[u] % total))[:left]:
            targets[user] += 1
        return targets

    def _next_user(self) -> str | None:
        """The user to make the next container for, or None when the pool is full."""
        if self.ready + self._filling >= self.size:
            return None
        targets = self._targets()
        have = {u: len(self._ready.get(u, ())) + self._filling_for.get(u, 0) for u in targets}
        user = max(targets, key=lambda u: targets[u] - have[u])
        return user if targets[user] > have[user] else None

    def _kick(self) -> None:
        """Start making containers until ready + being made reaches the size (counted at once,
        so a session that asks next waits for one of these instead of launching its own)."""
        if not self._started or self._closed or self._retry is not None:
            return
        while self._filling < FILLS_AT_ONCE and (user := self._next_user()) is not None:
            self._filling += 1
            self._filling_for[user] = self._filling_for.get(user, 0) + 1
            task = asyncio.get_running_loop().create_task(self._fill(user), name="sandbox-warm-pool-fill")
            self._fills.add(task)
            task.add_done_callback(self._fills.discard)

    def _retry_later(self) -> None:
        self._retry = None
        self._kick()

    async def _fill(self, user: str) -> None:
        try:
            with in_background():  # a call that needs a container goes first
                async with self._launch_slots.take():
                    pooled = await self._make(user)
        except asyncio.CancelledError:
            self._filled(user)
            raise
        except Exception as exc:
            log.warning("filling the warm pool failed (trying again in %g s): %s", RETRY_SECONDS, exc)
            if self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(RETRY_SECONDS, self._retry_later)
            self._filled(user)
            return
        if self._closed:
            self._filled(user)
            await self.discard(pooled)
            return
        self._ready.setdefault(user, deque()).append(pooled)
        self._filled(user)
        self._report()
        self._kick()  # a user asked meanwhile may still lack one

    def _filled(self, user: str) -> None:
        self._filling -= 1
        left = self._filling_for.get(user, 1) - 1
        if left:
            self._filling_for[user] = left
        else:
            self._filling_for.pop(user, None)
        self._arrived.set()

    async def _make(self, user: str) -> Pooled:
        loop = asyncio.get_running_loop()
        slot = await loop.run_in_executor(None, self.mounts.make, self._slots_dir)
        container_id: str | None = None
        listener = None
        try:
            listener = await loop.run_in_executor(None, self.launcher.listen)
            mounts = [
                {
                    "Type": "bind",
                    "Source": slot,
                    "Target": WORKSPACE_ROOT,
                    "ReadOnly": False,
                    "BindOptions": {"Propagation": "rslave"},
                }
            ]
            labels = {LABEL_POOL: "1"}
            if listener is not None:
                mounts.append(listener.mount)
                labels[LABEL_AGENT_LINK] = listener.name
            spec = self.launcher.spec(user, labels, mounts)
            name = f"dispatcher-{self.launcher.instance[:12]}-pool-{secrets.token_hex(4)}"
            container_id = await self.api.create_container(name, spec)
            if listener is not None:
                self.launcher.sockets.made(container_id, listener)
            await self.api.start(container_id)
            link = await self.launcher.attach_agent(container_id, user, [], listener=listener)
            if link is None:
                raise SandboxError("the image cannot run the agent: no warm pool without it")
            return Pooled(container_id, link, slot, user)
        except BaseException:
            if container_id is not None:
                with contextlib.suppress(Exception):
                    await self.api.remove(container_id)
                self.launcher.sockets.forget(container_id)
            elif listener is not None:
                self.launcher.sockets.discard(listener)
            await loop.run_in_executor(None, self.mounts.release, slot)
            raise
        finally:
            if listener is not None:
                listener.close()

    def _report(self) -> None:
        self._observer().pool_ready(self.ready)
