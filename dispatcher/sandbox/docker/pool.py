"""The warm pool: containers created, started and with their agent answering before any session asks.

A pooled container is given its session's workspace at adoption through a slot mount, confirmed
by its agent (``pool_adopt.py``). Nothing of any session ran in a pooled container before, and an
adopted container leaves the pool for good: it is removed with its session (or its idle expiry),
never pooled again.

Used only where it can keep these rules: runc (gVisor does not show host mounts made later), the
server as root (mount(2)), sessions without fs grants (their view is several mounts) and without
an egress CA bundle (mounted at creation); the session's egress listener is opened at adoption.
Other sessions launch as before. Pooled containers count towards no tenant's quota, are refilled
in the background up to ``size`` and never past it, and are removed at shutdown.

Labels: Docker fixes a container's labels when it is created, and a session's container carries
its session's and tenant's (operators find it by them; the start-up sweep keeps it by them). So
a pooled container is made *for* a session id not yet handed out, and a tenant: ``reserve`` gives a
new session of that tenant the id of a waiting container (or of one being made), and that
session, and only that one, adopts it (``take``). A session without a reservation (its id made
elsewhere) never adopts one: it launches its own. A reserved container whose session closes
before taking it is removed, never given to another. Pooled containers also carry
``dispatcher.pool`` and a fingerprint of their config and user. A restarted server removes the
waiting ones as orphans and keeps an adopted one for its session with its slot (the slot's mount
lives in the host's mount namespace): its new agent must see the session's workspace, pinned
again, before the session gets it back (``pool_adopt.readopt``).

Keys: the pool is kept per (tenant, sandbox user): a container runs as one uid:gid for its whole
life (its agent too), and with per-tenant uids each tenant's sandboxes run as its own ids. Setting
the uid at adoption instead would mean starting the agent at adoption (tens of ms of Python
start-up), which is what the pool is for. The ``size`` is shared among the keys of the latest
asks, in proportion (``pool_shares.py``); before any, among the configured tenants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.core.observe import NO_SANDBOX_OBSERVER, SandboxObserver
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.session import Session, new_session_id
from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.container.host import AgentLink
from dispatcher.sandbox.container.labels import (
    LABEL_POOL,
    LABEL_SESSION,
    LABEL_SPEC,
    LABEL_TENANT,
    pool_fingerprint,
)
from dispatcher.sandbox.docker.agent_socket import LABEL_AGENT_LINK
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.launch import ContainerLauncher
from dispatcher.sandbox.docker.pool_adopt import SlotMounts, adopt
from dispatcher.sandbox.docker.pool_shares import Key, Shares
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
    key: Key
    session_id: str
    """The session it is labelled for: the one that reserves it, or none (removed unused)."""


_MAKING = None
"""A claim whose container is still being made."""


class WarmPool:
    """Keeps ``size`` containers ready; ``reserve`` names a new session after one, ``take`` hands
    it to that session (or None: launch as usual)."""

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
        self._ready: dict[Key, deque[Pooled]] = {}  # waiting, reserved by no session yet
        self._making: dict[str, Key] = {}  # session id -> key of each container being made
        self._claims: dict[str, Pooled | None] = {}  # reserved: session id -> its container
        self._dropped: set[str] = set()  # reserved while being made, then released: remove
        self._arrived = asyncio.Event()  # set whenever a fill ends (ready, or failed)
        self._shares = Shares(self.size)
        self._adopted: dict[str, str] = {}  # container id -> slot, until the container is removed
        self._readopting: set[str] = set()  # kept at start-up for a session, not yet confirmed
        self._started = False
        self._retry: asyncio.TimerHandle | None = None
        self._fills: set[asyncio.Task[None]] = set()
        self._closed = False
        self.hits = 0
        self.misses = 0

    @property
    def ready(self) -> int:
        """Containers waiting now, reserved by no session."""
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

    def expect_tenants(self, tenants: Mapping[str, tuple[int | None, int | None]]) -> None:
        """The tenants (id -> their sandboxes' uid, gid; None: the config's user) the size is
        shared among before sessions ask (the server's config); ties go to those listed first."""
        keys = [(t, self.config.user_for(uid, gid)) for t, (uid, gid) in tenants.items()]
        if self._shares.expect(keys):
            self._rebalance()

    def start(self) -> None:
        """Remove slots a previous run left mounted, then fill in the background (after the
        start-up sweep of orphans, which would remove pooled containers)."""
        if self.size <= 0 or self._started or not self.mounts.available():
            return
        if not self.config.start_on_create:
            log.warning(
                "sandbox.warm_pool is set but sandbox.start_on_create is false: a pooled container "
                "is made for a session that starts its sandbox at creation, so none will be used; "
                "no pool is kept (set start_on_create: true to use it)"
            )
            return
        self._started = True
        self.mounts.release_stale(self._slots_dir, keep=set(self._adopted.values()))
        self._kick()

    def kept(self, container: Mapping[str, Any]) -> None:
        """The start-up sweep kept this listed container for a session to re-adopt: if it is a
        pooled one, its slot stays mounted (``start``) and goes with it, and its agent must see the
        session's workspace again before the session gets it (``pool_adopt.readopt``)."""
        if not (container.get("Labels") or {}).get(LABEL_POOL):
            return
        self._readopting.add(container["Id"])
        for mount in container.get("Mounts") or ():
            source = str(mount.get("Source") or "")
            if mount.get("Destination") == WORKSPACE_ROOT and self.mounts.owns(self._slots_dir, source):
                self._adopted[container["Id"]] = source

    def readopting(self, container_id: str) -> bool:
        """Whether the container is a pooled one a restarted server is re-adopting (asked once)."""
        if container_id in self._readopting:
            self._readopting.discard(container_id)
            return True
        return False

    def _key(self, session: Session) -> Key:
        return session.tenant_id, self.config.user_for(session.sandbox_uid, session.sandbox_gid)

    def reserve(self, session: Session) -> str | None:
        """The id ``session`` (not yet open; its id is a placeholder) should take so that it adopts
        a container waiting, or being made, for its tenant and user; None: there is none, it keeps
        its own id and launches its own container."""
        if not self._started or not self.usable_for(session):
            return None
        key = self._key(session)
        self._want(key)
        queue = self._ready.get(key)
        if queue:
            pooled = queue.popleft()
            self._claims[pooled.session_id] = pooled
            self._report()
            self._kick()
            return pooled.session_id
        for session_id, making in self._making.items():
            if making == key and session_id not in self._claims:
                self._claims[session_id] = _MAKING
                self._kick()
                return session_id
        return None

    def release(self, session_id: str) -> None:
        """The session closed (or was never opened): remove a container reserved for it and not
        taken; one still being made is removed when it is."""
        if session_id not in self._claims:
            return
        pooled = self._claims.pop(session_id)
        if pooled is None:
            self._dropped.add(session_id)
            return
        self._background(self.discard(pooled), "sandbox-warm-pool-release")

    async def take(self, session: Session) -> Pooled | None:
        """The container reserved for the session, its workspace mounted and confirmed, or None."""
        if session.session_id not in self._claims:
            self._want(self._key(session))  # the pool follows those who launch their own too
            self._missed()
            return None
        pooled = await self._claimed(session.session_id)
        if pooled is None:
            self._missed()
            return None
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
            self._missed()
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

    def _missed(self) -> None:
        self.misses += 1
        self._observer().pool_taken(False, 0.0)

    async def _claimed(self, session_id: str) -> Pooled | None:
        """The session's reserved container, once made (a launch of its own would take no less, and
        would compete with it for the launch slots); None: making it failed, or took too long."""
        deadline = asyncio.get_running_loop().time() + self.config.agent_start_timeout + 5
        while self._claims.get(session_id, False) is _MAKING and not self._closed:
            self._arrived.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                self.release(session_id)  # it is removed when it arrives
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        return self._claims.pop(session_id, None)

    def owns(self, container_id: str) -> bool:
        """Whether the container is the pool's (waiting, reserved or adopted, until it is removed)."""
        return (
            container_id in self._adopted
            or any(p.container_id == container_id for q in self._ready.values() for p in q)
            or any(p is not None and p.container_id == container_id for p in self._claims.values())
        )

    async def removed(self, container_id: str) -> None:
        """An adopted (or kept, not yet re-adopted) container was removed: unmount and remove its
        slot."""
        self._readopting.discard(container_id)
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
        """Stop filling and remove every waiting or reserved container (adopted ones go with
        their sessions)."""
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
        waiting += [p for p in self._claims.values() if p is not None]
        self._ready.clear()
        self._claims.clear()
        await asyncio.gather(*(self.discard(p) for p in waiting), return_exceptions=True)
        self._report()

    # -- filling ----------------------------------------------------------------------------

    def _background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._fills.add(task)
        task.add_done_callback(self._fills.discard)

    def _want(self, key: Key) -> None:
        """Count an ask for ``key``; waiting containers of keys now past their share are removed
        (only waiting ones: never one being made, reserved or adopted), so the refill makes
        ``key``'s."""
        self._shares.ask(key)
        self._rebalance()

    def _rebalance(self) -> None:
        """Remove waiting containers of keys past their share, then refill."""
        targets = self._shares.targets()
        surplus: list[Pooled] = []
        for other, queue in self._ready.items():
            keep = max(0, targets.get(other, 0) - self._unclaimed_making(other))
            surplus.extend(list(queue)[keep:])
        for pooled in surplus:
            self._ready[pooled.key].remove(pooled)
            self._background(self.discard(pooled), "sandbox-warm-pool-evict")
        if surplus:
            self._report()
        self._kick()

    def _unclaimed_making(self, key: Key | None = None) -> int:
        return sum(1 for sid, k in self._making.items() if sid not in self._claims and key in (None, k))

    def _next_key(self) -> Key | None:
        """The key to make the next container for, or None when the pool is full."""
        if self.ready + self._unclaimed_making() >= self.size:
            return None
        targets = self._shares.targets()
        if not targets:
            return None
        have = {k: len(self._ready.get(k, ())) + self._unclaimed_making(k) for k in targets}
        key = max(targets, key=lambda k: targets[k] - have[k])
        return key if targets[key] > have[key] else None

    def _kick(self) -> None:
        """Start making containers until ready + being made (for no session yet) reaches the size
        (counted at once, so a session that asks next reserves one of these instead of launching
        its own)."""
        if not self._started or self._closed or self._retry is not None:
            return
        while len(self._making) < FILLS_AT_ONCE and (key := self._next_key()) is not None:
            session_id = new_session_id()
            self._making[session_id] = key
            self._background(self._fill(key, session_id), "sandbox-warm-pool-fill")

    def _retry_later(self) -> None:
        self._retry = None
        self._kick()

    async def _fill(self, key: Key, session_id: str) -> None:
        try:
            with in_background():  # a call that needs a container goes first
                async with self._launch_slots.take():
                    pooled = await self._make(key, session_id)
        except asyncio.CancelledError:
            self._filled(session_id)
            raise
        except Exception as exc:
            log.warning("filling the warm pool failed (trying again in %g s): %s", RETRY_SECONDS, exc)
            if self._retry is None:
                self._retry = asyncio.get_running_loop().call_later(RETRY_SECONDS, self._retry_later)
            self._filled(session_id)
            return
        if self._closed or session_id in self._dropped:
            self._filled(session_id)
            await self.discard(pooled)
            self._kick()  # its session left: make one for the next
            return
        if session_id in self._claims:
            self._claims[session_id] = pooled
        else:
            self._ready.setdefault(key, deque()).append(pooled)
        self._filled(session_id)
        self._report()
        self._kick()  # a key asked for meanwhile may still lack one

    def _filled(self, session_id: str) -> None:
        """A fill ended; a reservation of a container that failed to be made is dropped (its
        session launches its own)."""
        self._making.pop(session_id, None)
        self._dropped.discard(session_id)
        if self._claims.get(session_id, False) is _MAKING:
            del self._claims[session_id]
        self._arrived.set()

    async def _make(self, key: Key, session_id: str) -> Pooled:
        tenant, user = key
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
            labels = {
                LABEL_POOL: "1",
                LABEL_SESSION: session_id,
                LABEL_TENANT: tenant,
                LABEL_SPEC: pool_fingerprint(self.config, user),
            }
            if listener is not None:
                mounts.append(listener.mount)
                labels[LABEL_AGENT_LINK] = listener.name
            spec = self.launcher.spec(user, labels, mounts)
            container_id = await self.api.create_container(self.launcher.container_name(session_id), spec)
            if listener is not None:
                self.launcher.sockets.made(container_id, listener)
            await self.api.start(container_id)
            link = await self.launcher.attach_agent(container_id, user, [], listener=listener)
            if link is None:
                raise SandboxError("the image cannot run the agent: no warm pool without it")
            return Pooled(container_id, link, slot, key, session_id)
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
