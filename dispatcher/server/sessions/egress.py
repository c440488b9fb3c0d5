"""The server's egress proxy: each open session's ``EgressContext``, the connections its sandbox's
agent hands over (``EgressGate``), and the human asked about an unlisted host.

A session's context is made when the session opens (or is given back) and closed when it ends,
which ends its tunnels; a call's tunnels end when that call is cancelled. The context outlives
the sandbox's agent (a recreated container keeps its session's byte quota and remembered hosts).

Asking (``unknown: prompt``) uses the session's confirmation broker and event stream, as a tool
call's question does: ``tool.confirmation_requested`` with ``tool_name: "egress"``,
``side_effect: network`` and ``input_summary: "connect HOST:PORT"``, on the call whose process
opened the connection (else the session's only running call, else the session alone); a
``ResolveConfirmation`` answers it. The approval mode applies as to a tool of the network class:
autonomous lets the host through unasked, cautious and manual ask, and the tenant's policy
denying the network class (or ``egress`` by name) refuses. Neither ever opens a port the tenant
closed, a refused address range or the server's own ports: the proxy checks those first. Nor a
host outside a narrowed session's ``egress_allow``: such a session is never asked about one
(``policy.session_policy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from dispatcher.core.approval.broker import Decision
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy, Mode
from dispatcher.core.call.approve import mode_policy
from dispatcher.core.events.payloads import ToolConfirmationRequested, ToolConfirmationResolved
from dispatcher.core.sessions.registry import BaseSessionListener, Restoration
from dispatcher.core.sessions.state import Call, SessionState
from dispatcher.core.types import SideEffect
from dispatcher.egress.networks import OwnEndpoints
from dispatcher.egress.policy import EgressPolicy, session_policy
from dispatcher.egress.prompt import PromptAnswer, PromptVerdict
from dispatcher.egress.proxy import EgressContext, TunnelStream, serve_tunnel
from dispatcher.egress.record import NO_OBSERVER, AuditRecorder, EgressObserver
from dispatcher.egress.resolver import Connector, Resolver, SystemResolver, TcpConnector

__all__ = ["EGRESS_TOOL", "EgressGateway"]

log = logging.getLogger("dispatcher.server.sessions.egress")

EGRESS_TOOL = "egress"
"""The ``tool_name`` of an egress question, and the name a tenant's policy may deny it by."""


class EgressGateway(BaseSessionListener):
    """Implements ``dispatcher.egress.gate.EgressGate`` for one server, and listens to its sessions."""

    def __init__(
        self,
        tenants: Callable[[str], tuple[EgressPolicy, ConfirmationPolicy]],
        *,
        default_policy: ConfirmationPolicy,
        confirmation_timeout: float,
        own: Callable[[], OwnEndpoints] = OwnEndpoints,
        audit: AuditRecorder | None = None,
        observer: EgressObserver = NO_OBSERVER,
        resolver: Resolver | None = None,
        connector: Connector | None = None,
    ) -> None:
        """``tenants``: a tenant id's egress policy and confirmation policy. ``own``: the server's
        listening endpoints (read at each connection: ports bound at start are known by then)."""
        self._tenants = tenants
        self._default_policy = default_policy
        self._timeout = confirmation_timeout
        self._own = own
        self._audit = audit
        self._observer = observer
        self._resolver = resolver or SystemResolver()
        self._connector = connector or TcpConnector()
        self._sessions: dict[str, tuple[SessionState, EgressContext]] = {}

    # -- SessionListener --------------------------------------------------------------------

    def session_opened(self, state: SessionState) -> None:
        session = state.session
        tenant, _ = self._tenants(session.tenant_id)
        caps = session.capabilities
        policy = session_policy(tenant, caps.egress_allow if caps is not None else None)
        ctx = EgressContext(
            tenant_id=session.tenant_id,
            session_id=session.session_id,
            policy=policy,
            allow=policy.allow,
            resolver=self._resolver,
            connector=self._connector,
            audit=self._audit,
            observer=self._observer,
            running_calls=lambda: [c.tool_use_id for c in state.calls],
            ask=lambda host, port, call: self._ask(state, host, port, call),
        )
        self._sessions[session.session_id] = (state, ctx)

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        self.session_opened(state)

    def session_closed(self, state: SessionState) -> None:
        entry = self._sessions.pop(state.session.session_id, None)
        if entry is not None:
            entry[1].close()

    def context(self, session_id: str) -> EgressContext | None:
        """The session's egress state (tests, diagnostics)."""
        entry = self._sessions.get(session_id)
        return entry[1] if entry is not None else None

    def traffic(self, session_id: str) -> tuple[int, int]:
        """Bytes the session's sandbox sent and received through the proxy so far."""
        entry = self._sessions.get(session_id)
        return (entry[1].bytes_sent, entry[1].bytes_received) if entry is not None else (0, 0)

    # -- EgressGate ---------------------------------------------------------------------------

    def ca_bundle(self, tenant_id: str) -> str | None:
        return self._tenants(tenant_id)[0].ca_bundle

    async def serve(self, session_id: str, stream: TunnelStream, tool_use_id: str | None) -> None:
        entry = self._sessions.get(session_id)
        if entry is None:  # the session ended while its sandbox was still there
            ctx = EgressContext("", session_id, EgressPolicy(), allow=(), closed=True)
            await serve_tunnel(stream, ctx)
            return
        state, ctx = entry
        ctx.own = self._own()
        call_id = ctx.call_of(tool_use_id)
        call = _call(state, call_id)
        if call is not None and call.cancel_event.is_set():
            await stream.close()  # the call is over: its processes get no new connection
            return
        task = asyncio.current_task()
        assert task is not None

        def cancelled() -> None:
            task.cancel()

        if call is not None:
            call.wakers.append(cancelled)
        try:
            await serve_tunnel(stream, ctx, tool_use_id=call_id)
        except asyncio.CancelledError:
            if call is None or not call.cancel_event.is_set():
                raise  # not the call's cancel: the server's
            task.uncancel()
        finally:
            if call is not None:
                with contextlib.suppress(ValueError):
                    call.wakers.remove(cancelled)

    # -- asking -----------------------------------------------------------------------------

    async def _ask(self, state: SessionState, host: str, port: int, call_id: str | None) -> PromptAnswer:
        session = state.session
        _, tenant_policy = self._tenants(session.tenant_id)
        policy = mode_policy(session.policy or tenant_policy or self._default_policy, state.mode)
        mode = policy.mode_for(EGRESS_TOOL, SideEffect.NETWORK, session.workspace_path)
        if mode is Mode.DENY:
            return PromptAnswer(PromptVerdict.DENY)
        if mode is Mode.AUTO:
            return PromptAnswer(PromptVerdict.ALLOW)
        call = _call(state, call_id)
        turn_id = call.turn_id if call is not None else ""
        request_id, answer = state.broker.open()

        def publish(payload: Any) -> None:
            state.bus.publish(payload, turn_id=turn_id, tool_use_id=call_id or "")

        publish(
            ToolConfirmationRequested(
                request_id=request_id,
                tool_name=EGRESS_TOOL,
                input_summary=f"connect {host}:{port}",
                side_effect=SideEffect.NETWORK.value,
                projected_modifications=(),
            )
        )
        asked = time.monotonic()
        try:
            decision, remember = await asyncio.wait_for(asyncio.shield(answer), self._timeout)
        except TimeoutError:
            state.broker.expire(request_id)
            publish(ToolConfirmationResolved(request_id=request_id, decision="deny", reason="timeout"))
            return PromptAnswer(PromptVerdict.TIMEOUT)
        except asyncio.CancelledError:
            state.broker.expire(request_id)
            publish(ToolConfirmationResolved(request_id=request_id, decision="deny", reason="cancelled"))
            raise
        log.info(
            "egress confirmation answered",
            extra={
                "session_id": session.session_id,
                "host": host,
                "decision": decision.value,
                "waited_seconds": round(time.monotonic() - asked, 3),
            },
        )
        publish(ToolConfirmationResolved(request_id=request_id, decision=decision.value, reason="client"))
        verdict = PromptVerdict.ALLOW if decision is Decision.ALLOW else PromptVerdict.DENY
        return PromptAnswer(verdict, remember=remember)


def _call(state: SessionState, call_id: str | None) -> Call | None:
    if call_id is None:
        return None
    return next((c for c in state.calls if c.tool_use_id == call_id), None)
