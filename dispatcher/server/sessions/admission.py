"""What the server lets in now: each tenant's dispatch and transfer slots (queued, FIFO) and watch
streams (WatchSession and WatchProcess), the work in flight (which a graceful shutdown waits for), and whether it still takes
work at all (draining: refused, and every watch stream ended)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field

from dispatcher.core.events.bus import EventBus, Subscription
from dispatcher.server.requests.errors import QuotaExceeded, ShuttingDown
from dispatcher.server.tenancy.slots import Slot, Slots
from dispatcher.server.tenancy.tenants import Tenant

__all__ = ["Admission", "Admitted"]


@dataclass(slots=True)
class _TenantState:
    dispatches: Slots
    transfers: Slots
    watch_streams: int = 0
    port_connections: int = 0
    port_connections_of: dict[str, int] = field(default_factory=dict)
    """By session: only sessions with one open."""


class Admission:
    """Admits a tenant's dispatches, transfers and watch streams within its quotas."""

    def __init__(self, queue_observer: Callable[[float], None] | None = None) -> None:
        """``queue_observer``: told how long each Dispatch waited for a slot."""
        self._queue_observer = queue_observer
        self._tenants: dict[str, _TenantState] = {}
        self._watchers: set[Subscription] = set()
        self._stops: set[asyncio.Event] = set()
        self._draining = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def check_open(self) -> None:
        """Refuse new work once draining.

        Raises:
            ShuttingDown: the server is draining.
        """
        if self._draining:
            raise ShuttingDown("the server is shutting down")

    def start_draining(self) -> None:
        """Refuse new work and end every watch stream (after it drains what it holds)."""
        self._draining = True
        for sub in tuple(self._watchers):
            sub.close()
        for stop in tuple(self._stops):
            stop.set()

    def dispatch_slot(self, tenant: Tenant) -> Admitted:
        """Hold one of the tenant's concurrent-dispatch slots (``async with``), waiting for one in
        line for up to ``queue_timeout_seconds``.

        Raises:
            QuotaExceeded: all ``max_concurrent_dispatches`` slots stayed taken.
        """
        limit = tenant.quotas.max_concurrent_dispatches
        refusal = f"tenant {tenant.tenant_id!r} already runs {limit} dispatches (max_concurrent_dispatches)"
        return Admitted(self, self._state(tenant).dispatches.slot(refusal))

    def transfer_slot(self, tenant: Tenant) -> Admitted:
        """Hold one of the tenant's transfer slots (``max_concurrent_transfers``, queued like
        dispatches).

        Raises:
            QuotaExceeded: all slots stayed taken.
        """
        limit = tenant.quotas.max_concurrent_transfers
        refusal = f"tenant {tenant.tenant_id!r} already runs {limit} transfers (max_concurrent_transfers)"
        return Admitted(self, self._state(tenant).transfers.slot(refusal))

    @asynccontextmanager
    async def watch(self, tenant: Tenant, bus: EventBus, after_seq: int) -> AsyncIterator[Subscription]:
        """A subscription to ``bus`` after ``after_seq``, counted as one of the tenant's watch
        streams and ended by ``start_draining``.

        Raises:
            QuotaExceeded: the tenant already has ``max_watch_streams`` open.
        """
        with self._watch_stream(tenant):
            async with bus.subscribe(after_seq=after_seq) as sub:
                self._watchers.add(sub)
                try:
                    yield sub
                finally:
                    self._watchers.discard(sub)

    @asynccontextmanager
    async def watch_slot(self, tenant: Tenant) -> AsyncIterator[asyncio.Event]:
        """One of the tenant's watch streams for a stream that is not a bus subscription
        (WatchProcess): the event given is set when the server starts draining, for the stream to
        end.

        Raises:
            ShuttingDown: the server is draining.
            QuotaExceeded: the tenant already has ``max_watch_streams`` open.
        """
        self.check_open()
        stop = asyncio.Event()
        with self._watch_stream(tenant):
            self._stops.add(stop)
            try:
                yield stop
            finally:
                self._stops.discard(stop)

    @contextmanager
    def port_slot(self, tenant: Tenant, session_id: str) -> Iterator[asyncio.Event]:
        """One of the tenant's (and the session's) port connections (ConnectPort): the event given
        is set when the server starts draining, for the connection to end.

        Raises:
            ShuttingDown: the server is draining.
            QuotaExceeded: ``max_port_connections`` or ``max_port_connections_per_session``.
        """
        self.check_open()
        state = self._state(tenant)
        quotas = tenant.quotas
        if state.port_connections >= quotas.max_port_connections:
            raise QuotaExceeded(
                f"tenant {tenant.tenant_id!r} already has {quotas.max_port_connections} port "
                "connections open (max_port_connections): close one first"
            )
        held = state.port_connections_of.get(session_id, 0)
        if held >= quotas.max_port_connections_per_session:
            raise QuotaExceeded(
                f"session {session_id!r} already has {held} port connections open "
                "(max_port_connections_per_session): close one first"
            )
        state.port_connections += 1
        state.port_connections_of[session_id] = held + 1
        stop = asyncio.Event()
        self._stops.add(stop)
        try:
            yield stop
        finally:
            self._stops.discard(stop)
            state.port_connections -= 1
            left = state.port_connections_of[session_id] - 1
            if left:
                state.port_connections_of[session_id] = left
            else:
                del state.port_connections_of[session_id]

    @contextmanager
    def _watch_stream(self, tenant: Tenant) -> Iterator[None]:
        """Count one watch stream of the tenant (WatchSession and WatchProcess alike) while held."""
        state = self._state(tenant)
        limit = tenant.quotas.max_watch_streams
        if limit is not None and state.watch_streams >= limit:
            raise QuotaExceeded(
                f"tenant {tenant.tenant_id!r} already has {limit} open watch streams (max_watch_streams, "
                "WatchSession and WatchProcess together)"
            )
        state.watch_streams += 1
        try:
            yield
        finally:
            state.watch_streams -= 1

    def _work_started(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def _work_ended(self) -> None:
        self._in_flight -= 1
        if not self._in_flight:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no Dispatch call is in flight; False if ``timeout`` passed first."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _state(self, tenant: Tenant) -> _TenantState:
        state = self._tenants.get(tenant.tenant_id)
        if state is None:
            q = tenant.quotas
            state = self._tenants[tenant.tenant_id] = _TenantState(
                Slots(q.max_concurrent_dispatches, q.queue_timeout_seconds, observe=self._queue_observer),
                Slots(q.max_concurrent_transfers, q.queue_timeout_seconds),
            )
        return state


class Admitted:
    """A dispatch or transfer admitted for an ``async with`` block: refused while draining, one of
    the tenant's slots held, counted as work in flight. A class rather than a generator: every
    Dispatch enters one."""

    __slots__ = ("_admission", "_slot")

    def __init__(self, admission: Admission, slot: Slot) -> None:
        self._admission = admission
        self._slot = slot

    async def __aenter__(self) -> None:
        self._admission.check_open()
        await self._slot.__aenter__()
        self._admission._work_started()

    async def __aexit__(self, *exc_info: object) -> None:
        self._admission._work_ended()
        await self._slot.__aexit__(*exc_info)
