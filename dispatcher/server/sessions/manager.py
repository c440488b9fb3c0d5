"""The server's side of sessions: tenants (who owns what, quotas), watchers, and shutdown.

What a tenant may start now (dispatch, transfer and watch-stream slots, nothing once draining)
is ``admission.py``'s; this module asks it.

Which sessions exist and whether one is open is the core's ``SessionRegistry``
(``dispatcher.sessions``); this module checks a tenant's requests against it, and opens sessions
there, new (``create``) or given back after a restart (``restore``), by one path. Their clocks
(expiry, renew, pause, resume) are the core's ``SessionLifecycle``; this module applies the tenant's
limits to them (``lifetime.py``) and counts each request on a session as activity (``get``;
watching is not).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from dispatcher.core.call.ordering import Ordering
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.dispatcher import Decision, ToolDispatcher
from dispatcher.core.errors import UnknownSessionError
from dispatcher.core.events.bus import Subscription
from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.sessions.clock import Lifetime, OnExpire
from dispatcher.core.sessions.registry import Restoration, SessionListener
from dispatcher.core.sessions.session import Session, SessionStatus, new_session_id
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.types import Role, ToolDefinition, ToolUseBlock
from dispatcher.egress.policy import session_policy
from dispatcher.server.persistence.state import IN_MEMORY, Persistence
from dispatcher.server.requests.checks import check_id, check_labels
from dispatcher.server.requests.errors import InvalidRequest, QuotaExceeded
from dispatcher.server.sessions.admission import Admission
from dispatcher.server.sessions.create_requests import CreateRequests
from dispatcher.server.sessions.dispatch_stream import DispatchCall, DispatchScope
from dispatcher.server.sessions.lifetime import check_tenant_ttl, requested_lifetime
from dispatcher.server.tenancy.session import build_session
from dispatcher.server.tenancy.tenants import Tenant, allowed_mode, resolve_workspace
from dispatcher.tools.shell import describe_network
from dispatcher.wire.convert import SessionInfo
from dispatcher.wire.convert_policy import narrow_capabilities

log = logging.getLogger("dispatcher.server.sessions.manager")


class SessionManager:
    """Creates, finds and closes sessions per tenant. A session of another tenant does not exist."""

    def __init__(
        self,
        dispatcher: ToolDispatcher,
        *,
        persistence: Persistence = IN_MEMORY,
        listeners: Sequence[SessionListener] = (),
        lifetime: Lifetime | None = None,
        queue_observer: Callable[[float], None] | None = None,
        sandbox_ids: SandboxProvider | None = None,
    ) -> None:
        """``persistence`` (default: in memory, nothing survives the process) is told of every
        session first, then ``listeners`` in their order; they are closed in the reverse order.
        ``lifetime``: the clocks of a session whose request names none (``sessions:``);
        ``queue_observer``: told how long each Dispatch waited for a slot; ``sandbox_ids``: the
        sandbox backend, which may name a new session after a sandbox made ahead for it."""
        self.dispatcher = dispatcher
        self._sandbox_ids = sandbox_ids
        self.lifetime = lifetime or Lifetime()
        self.lifecycle = dispatcher.lifecycle
        self.admission = Admission(queue_observer)
        self._create_requests = CreateRequests()
        self.registry = dispatcher.sessions
        self.persistence = persistence
        # Stored first: a session exists once it is stored, before its sandbox starts or anyone
        # counts it; on close the store forgets it last.
        self.registry.subscribe(self.persistence, *listeners)
        self._background: set[asyncio.Task[None]] = set()

    # --- lifecycle -----------------------------------------------------------------------------

    def create(
        self,
        tenant: Tenant,
        workspace: str,
        role: Role,
        labels: Mapping[str, str],
        *,
        approval_mode: str | None = None,
        capabilities: Capabilities | None = None,
        ttl_seconds: float | None = None,
        idle_timeout_seconds: float | None = None,
        on_expire: OnExpire | None = None,
        request_id: str = "",
    ) -> SessionState:
        """Open a session in ``workspace`` (made if missing) under the tenant's root, in
        ``approval_mode`` (None: the first of the tenant's ``approval_modes``), with ``capabilities``
        narrowing the tenant's (never widening them), under the given clocks (None: the server's).
        A ``request_id`` seen from the tenant in the last 10 minutes with the same request gives
        that session back.

        Raises:
            InvalidRequest: bad workspace name, labels or mode; a mode the tenant does not allow;
                capabilities wider than the tenant's; a TTL above the tenant's maximum.
            AlreadyExists: ``request_id`` names a different request.
            QuotaExceeded: the tenant already has ``max_sessions`` open.
            ShuttingDown: the server is draining.
        """
        self.admission.check_open()
        check_id("request_id", request_id)
        life = requested_lifetime(self.lifetime, tenant, ttl_seconds, idle_timeout_seconds, on_expire)
        fingerprint = repr((workspace, role, sorted(labels.items()), approval_mode, capabilities, life))
        earlier = self._create_requests.find(tenant.tenant_id, request_id, fingerprint)
        if earlier is not None:
            return self.get(tenant, earlier)
        state = self._create(tenant, workspace, role, labels, approval_mode, capabilities, life)
        self._create_requests.remember(tenant.tenant_id, request_id, fingerprint, state.session.session_id)
        return state

    def _create(
        self,
        tenant: Tenant,
        workspace: str,
        role: Role,
        labels: Mapping[str, str],
        approval_mode: str | None,
        capabilities: Capabilities | None,
        lifetime: Lifetime,
    ) -> SessionState:
        check_labels(labels)
        limit = tenant.quotas.max_sessions
        if limit is not None and self.registry.count(tenant.tenant_id) >= limit:
            raise QuotaExceeded(
                f"tenant {tenant.tenant_id!r} already has {limit} open sessions (max_sessions)"
            )
        try:
            mode = allowed_mode(tenant, approval_mode)
            known = (d.name for d in self.dispatcher.registry.definitions(role))
            narrowed = narrow_capabilities(tenant.capabilities, capabilities, known)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        name, path = resolve_workspace(tenant, workspace)
        session = build_session(
            tenant,
            new_session_id(),
            name,
            str(path),
            role,
            labels,
            approval_mode=mode,
            capabilities=narrowed,
        )
        # A sandbox made ahead for an id (a warm pool's container, labelled with it) is this
        # session's when it takes that id.
        ids = self._sandbox_ids
        reserved = ids.reserve_session_id(session) if ids is not None else None
        if ids is None or reserved is None:
            return self._open(tenant, session, None, lifetime)
        try:
            return self._open(tenant, dataclasses.replace(session, session_id=reserved), None, lifetime)
        except BaseException:
            ids.release_session_id(reserved)
            raise

    def restore(self, tenant: Tenant, session: Session, restored: Restoration) -> SessionState:
        """Give back a session a restarted server had (no quota: it was admitted before).

        One stored before sessions had clocks gets the server's default ones (within its tenant's
        maximum), starting now: otherwise it would never expire. One with clocks lives under its
        tenant's maximum as configured now, counted from its creation."""
        lifetime = None
        if restored.clock is None:
            lifetime = requested_lifetime(self.lifetime, tenant, None, None, None)
        else:
            restored.clock.limit_life(tenant.max_session_ttl_seconds or 0.0, restored.create_time)
        return self._open(tenant, session, restored, lifetime)

    def _open(
        self, tenant: Tenant, session: Session, restored: Restoration | None, lifetime: Lifetime | None = None
    ) -> SessionState:
        """The one way a session opens: in the registry, whose listeners store it (a new one before
        it is acknowledged), start or re-adopt its sandbox and count it."""
        state = self.registry.open(session, restored=restored, lifetime=lifetime)
        log.info(
            "session created" if restored is None else "session given back",
            extra={
                "tenant_id": tenant.tenant_id,
                "session_id": session.session_id,
                "workspace": session.workspace_name,
            },
        )
        return state

    def get(self, tenant: Tenant, session_id: str, *, touch: bool = True) -> SessionState:
        """The tenant's open (or paused) session; ``touch``: the request counts as its activity.

        Raises:
            UnknownSessionError: no such open session for this tenant (other tenants' look the same);
                one of its own that ended says how (expired when and why, or closed), from the
                moment it began to close.
            InvalidRequest: the id is longer than any session id.
        """
        check_id("session_id", session_id)
        if self.registry.is_open(session_id):
            state = self.registry.get(session_id)
            if state.session.tenant_id == tenant.tenant_id:
                if touch:
                    self.lifecycle.touch(state)
                return state
        ended = self.registry.ended(session_id)
        if ended is not None and ended.tenant_id == tenant.tenant_id:
            raise UnknownSessionError(ended.message(session_id))
        raise UnknownSessionError(f"no session {session_id!r}")

    def renew(self, tenant: Tenant, session_id: str, ttl_seconds: float) -> SessionState:
        """A new expiry ``ttl_seconds`` from now, within the tenant's maximum.

        Raises:
            InvalidRequest: naming the maximum.
        """
        state = self.get(tenant, session_id)
        check_tenant_ttl(tenant, ttl_seconds)
        self.lifecycle.renew(state, ttl_seconds)
        return state

    async def pause(self, tenant: Tenant, session_id: str) -> SessionState:
        state = self.get(tenant, session_id)
        await self.lifecycle.pause(state)
        return state

    async def resume(self, tenant: Tenant, session_id: str) -> SessionState:
        state = self.get(tenant, session_id)
        await self.lifecycle.resume(state)
        return state

    def count(self) -> int:
        """Open sessions, every tenant's."""
        return len(self.registry)

    def list_for(self, tenant: Tenant) -> list[SessionState]:
        return sorted(
            (s for s in self.registry if s.session.tenant_id == tenant.tenant_id), key=lambda s: s.create_time
        )

    async def close(self, tenant: Tenant, session_id: str) -> None:
        """Cancel the session's tools, stop its sandbox and forget it; the workspace stays."""
        state = self.get(tenant, session_id)
        self.registry.begin_close(session_id)  # from here on it is found closed
        try:
            await self.dispatcher.close_session(session_id)
        finally:
            self.registry.finish_close(state)
        log.info("session closed", extra={"tenant_id": tenant.tenant_id, "session_id": session_id})

    def info(self, state: SessionState) -> SessionInfo:
        s = state.session
        return SessionInfo(
            session_id=s.session_id,
            workspace=s.workspace_name,
            workspace_path=s.workspace_path,
            role=s.role,
            labels=dict(s.labels),
            create_time=state.create_time,
            last_event_seq=state.bus.last_seq,
            approval_mode=state.mode,
            capabilities=s.capabilities or Capabilities(),
            plan=tuple(state.plan),
            expire_time=state.clock.expire_time,
            idle_expire_time=state.clock.idle_expire_time,
            paused=state.status is SessionStatus.PAUSED,
            pending_request_ids=tuple(state.broker.pending_ids()),
            last_activity_time=state.clock.last_activity,
        )

    # --- calls ---------------------------------------------------------------------------------

    def tools(self, tenant: Tenant, session_id: str) -> list[ToolDefinition]:
        state = self.get(tenant, session_id)
        caps = state.session.capabilities
        egress = session_policy(tenant.egress, caps.egress_allow if caps is not None else None)
        defs = self.dispatcher.get_definitions_for_session(state.session)
        return sorted((describe_network(d, egress.allow, egress) for d in defs), key=lambda d: d.name)

    @asynccontextmanager
    async def transfer_slot(self, tenant: Tenant, state: SessionState) -> AsyncIterator[None]:
        """Hold one of the tenant's transfer slots (``Admission.transfer_slot``) and the session,
        resumed if it was paused.

        Raises:
            QuotaExceeded: all slots stayed taken.
        """
        async with self.admission.transfer_slot(tenant), self.lifecycle.hold(state):
            yield

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no Dispatch call is in flight; False if ``timeout`` passed first."""
        return await self.admission.wait_idle(timeout)

    def dispatch(
        self,
        tenant: Tenant,
        state: SessionState,
        turn_id: str,
        tool_uses: Sequence[ToolUseBlock],
        *,
        max_pending: int = 4096,
        ordering: Ordering | None = None,
    ) -> DispatchScope:
        """One Dispatch call of the session (``async with``), holding one of the tenant's dispatch
        slots.

        Raises:
            QuotaExceeded: all ``max_concurrent_dispatches`` slots are taken.
        """

        def make() -> DispatchCall:
            return DispatchCall(
                self.dispatcher,
                state.session,
                turn_id,
                tool_uses,
                spawn=self.spawn,
                max_pending=max_pending,
                ordering=ordering,
            )

        return DispatchScope(self.admission.dispatch_slot(tenant), self.lifecycle.hold(state), state, make)

    async def cancel(self, tenant: Tenant, session_id: str) -> None:
        self.get(tenant, session_id)
        await self.dispatcher.cancel_session_tools(session_id)

    def resolve(
        self, tenant: Tenant, session_id: str, request_id: str, decision: Decision, remember: bool
    ) -> tuple[bool, Decision, bool]:
        """First answer wins: (applied, winner, remembered); raises UnknownConfirmationError for an
        unknown request."""
        self.get(tenant, session_id)
        check_id("request_id", request_id)
        # Asked to remember, and the request's tool is one whose answers can be (not always-prompt).
        remembers = remember and self.dispatcher.broker(session_id).rememberable(request_id)
        applied, winner = self.dispatcher.resolve_confirmation(
            session_id, request_id, decision, remember=remember
        )
        remembered = applied and remembers
        log.info(
            "confirmation answered",
            extra={
                "tenant_id": tenant.tenant_id,
                "session_id": session_id,
                "request_id": request_id,
                "decision": str(decision),
                "applied": applied,
            },
        )
        return applied, winner, remembered

    @asynccontextmanager
    async def watch(self, tenant: Tenant, session_id: str, after_seq: int) -> AsyncIterator[Subscription]:
        """A subscription to every event of the session after ``after_seq``; ended on shutdown.

        Raises:
            QuotaExceeded: the tenant already has ``max_watch_streams`` open.
        """
        self.admission.check_open()
        self.get(tenant, session_id, touch=False)  # watching is not activity
        async with self.admission.watch(tenant, self.dispatcher.events(session_id), after_seq) as sub:
            yield sub

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run cleanup work that must outlive the RPC that started it (kept until shutdown)."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- shutdown ------------------------------------------------------------------------------

    def start_draining(self) -> None:
        """Refuse new work and end every watch stream (after it drains what it holds)."""
        self.admission.start_draining()

    async def cancel_all(self) -> None:
        """Cancel the tools of every session (shutdown); returns when they have ended."""
        ids = self.registry.live_ids()
        await asyncio.gather(
            *(self.dispatcher.cancel_session_tools(sid) for sid in ids), return_exceptions=True
        )

    async def aclose(self, timeout: float = 30.0, *, keep_sessions: bool = False) -> None:
        """Close every session (stopping its sandbox), tolerating failures of single sessions.

        ``keep_sessions``: leave them open and stored, for the next start to give back.
        """
        self.start_draining()
        if self._background:
            await asyncio.wait(tuple(self._background), timeout=timeout)
        if keep_sessions:
            return
        for session_id in self.registry.live_ids():
            try:
                await self.dispatcher.close_session(session_id)
            except Exception:
                log.exception("closing session failed", extra={"session_id": session_id})
