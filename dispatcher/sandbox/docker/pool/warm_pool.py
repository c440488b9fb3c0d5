"""The warm pool: containers created, started and with their agent answering before any session asks.

A pooled container is given its session's workspace at adoption through a slot mount, confirmed
by its agent (``adopt.py``). Nothing of any session ran in a pooled container before, and an
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
again, before the session gets it back (``adopt.readopt``).

Keys: the pool is kept per (tenant, sandbox user): a container runs as one uid:gid for its whole
life (its agent too), and with per-tenant uids each tenant's sandboxes run as its own ids. Setting
the uid at adoption instead would mean starting the agent at adoption (tens of ms of Python
start-up), which is what the pool is for. The ``size`` is shared among the keys of the latest
asks, in proportion (``shares.py``); before any, among the configured tenants.

Who holds which container is the ledger's (``ledger.py``); making them, the filler's (``filler.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from dispatcher.core.observe import NO_SANDBOX_OBSERVER, SandboxObserver
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.container.labels import LABEL_POOL
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.launch import ContainerLauncher
from dispatcher.sandbox.docker.pool.adopt import SlotMounts, adopt
from dispatcher.sandbox.docker.pool.filler import Filler
from dispatcher.sandbox.docker.pool.ledger import Ledger, Pooled
from dispatcher.sandbox.docker.pool.shares import Key, Shares
from dispatcher.sandbox.launch_slots import LaunchSlots

log = logging.getLogger(__name__)


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
        self._observer = observer
        self.mounts = mounts or SlotMounts(lambda: launcher.can_mount)
        self._ledger = Ledger()
        self._shares = Shares(self.size)
        self._closed = False
        self._filler = Filler(
            self._ledger,
            self._shares,
            launcher,
            api,
            lambda: self.mounts,
            slots_dir,
            launch_slots=launch_slots,
            discard=self.discard,
            report=self._report,
            closed=lambda: self._closed,
        )
        self.hits = 0
        self.misses = 0

    @property
    def ready(self) -> int:
        """Containers waiting now, reserved by no session."""
        return self._ledger.waiting

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
        if self.size <= 0 or self._filler.started or not self.mounts.available():
            return
        if not self.config.start_on_create:
            log.warning(
                "sandbox.warm_pool is set but sandbox.start_on_create is false: a pooled container "
                "is made for a session that starts its sandbox at creation, so none will be used; "
                "no pool is kept (set start_on_create: true to use it)"
            )
            return
        self._filler.started = True
        self.mounts.release_stale(self._slots_dir, keep=set(self._ledger.adopted.values()))
        self._filler.kick()

    def kept(self, container: Mapping[str, Any]) -> None:
        """The start-up sweep kept this listed container for a session to re-adopt: if it is a
        pooled one, its slot stays mounted (``start``) and goes with it, and its agent must see the
        session's workspace again before the session gets it (``adopt.readopt``)."""
        if not (container.get("Labels") or {}).get(LABEL_POOL):
            return
        self._ledger.readopting.add(container["Id"])
        for mount in container.get("Mounts") or ():
            source = str(mount.get("Source") or "")
            if mount.get("Destination") == WORKSPACE_ROOT and self.mounts.owns(self._slots_dir, source):
                self._ledger.adopted[container["Id"]] = source

    def readopting(self, container_id: str) -> bool:
        """Whether the container is a pooled one a restarted server is re-adopting (asked once)."""
        if container_id in self._ledger.readopting:
            self._ledger.readopting.discard(container_id)
            return True
        return False

    def _key(self, session: Session) -> Key:
        return session.tenant_id, self.config.user_for(session.sandbox_uid, session.sandbox_gid)

    def reserve(self, session: Session) -> str | None:
        """The id ``session`` (not yet open; its id is a placeholder) should take so that it adopts
        a container waiting, or being made, for its tenant and user; None: there is none, it keeps
        its own id and launches its own container."""
        if not self._filler.started or not self.usable_for(session):
            return None
        key = self._key(session)
        self._want(key)
        reserved = self._ledger.reserve(key)
        if reserved is None:
            return None
        session_id, was_waiting = reserved
        if was_waiting:
            self._report()
        self._filler.kick()
        return session_id

    def release(self, session_id: str) -> None:
        """The session closed (or was never opened): remove a container reserved for it and not
        taken; one still being made is removed when it is."""
        pooled = self._ledger.release(session_id)
        if pooled is not None:
            self._filler.background(self.discard(pooled), "sandbox-warm-pool-release")

    async def take(self, session: Session) -> Pooled | None:
        """The container reserved for the session, its workspace mounted and confirmed, or None."""
        if not self._ledger.reserved(session.session_id):
            self._want(self._key(session))  # the pool follows those who launch their own too
            self._missed()
            return None
        pooled = await self._claimed(session.session_id)
        if pooled is None:
            self._missed()
            return None
        started = time.monotonic()
        try:
            self._ledger.adopted[pooled.container_id] = pooled.slot
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
        while self._ledger.still_making(session_id) and not self._closed:
            self._ledger.arrived.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                self.release(session_id)  # it is removed when it arrives
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ledger.arrived.wait(), remaining)
        return self._ledger.claimed(session_id)

    def owns(self, container_id: str) -> bool:
        """Whether the container is the pool's (waiting, reserved or adopted, until it is removed)."""
        return self._ledger.owns(container_id)

    async def removed(self, container_id: str) -> None:
        """An adopted (or kept, not yet re-adopted) container was removed: unmount and remove its
        slot."""
        self._ledger.readopting.discard(container_id)
        slot = self._ledger.adopted.pop(container_id, None)
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
        self._ledger.adopted.pop(pooled.container_id, None)
        await asyncio.get_running_loop().run_in_executor(None, self.mounts.release, pooled.slot)

    async def aclose(self) -> None:
        """Stop filling and remove every waiting or reserved container (adopted ones go with
        their sessions)."""
        self._closed = True
        await self._filler.stop()
        waiting = self._ledger.clear()
        await asyncio.gather(*(self.discard(p) for p in waiting), return_exceptions=True)
        self._report()

    # -- demand ------------------------------------------------------------------------------

    def _want(self, key: Key) -> None:
        """Count an ask for ``key``; waiting containers of keys now past their share are removed
        (only waiting ones: never one being made, reserved or adopted), so the refill makes
        ``key``'s."""
        self._shares.ask(key)
        self._rebalance()

    def _rebalance(self) -> None:
        """Remove waiting containers of keys past their share, then refill."""
        surplus = self._ledger.surplus(self._shares.targets())
        for pooled in surplus:
            self._filler.background(self.discard(pooled), "sandbox-warm-pool-evict")
        if surplus:
            self._report()
        self._filler.kick()

    def _report(self) -> None:
        self._observer().pool_ready(self.ready)
