"""The dispatcher: the tool registry, open sessions, cancellation and confirmation answers.

Each call's steps are ``core/call/pipeline.py``; this module owns what outlives one call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dispatcher.core.approval.broker import ConfirmationBroker, Decision
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy
from dispatcher.core.audit import STAGED_APPLIED, STAGED_DISCARDED, AuditSink
from dispatcher.core.call.ordering import CHANGES, MessageOrder, Ordering
from dispatcher.core.call.pipeline import CallRun, PipelineDeps
from dispatcher.core.call.settings import DispatcherConfig
from dispatcher.core.call.timeouts import check_timeout_names
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.errors import UnknownSessionError
from dispatcher.core.events.bus import EventBus
from dispatcher.core.events.payloads import StagedApplied, StagedDiscarded
from dispatcher.core.observe import NO_OBSERVER, CallObserver
from dispatcher.core.process_api import ProcessControl
from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.registry import ToolRegistry
from dispatcher.core.sandbox_api import Sandbox
from dispatcher.core.sessions.expiry import LifecycleHooks, SessionLifecycle
from dispatcher.core.sessions.processes import ProcessMemory
from dispatcher.core.sessions.registry import SessionRegistry
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.core.sessions.state import Call, SessionState
from dispatcher.core.staging import apply as staged_apply
from dispatcher.core.staging.apply import ApplyOutcome
from dispatcher.core.staging.area import StagedChange
from dispatcher.core.types import ToolDefinition, ToolFactory, ToolResultBlock, ToolUseBlock

__all__ = ["Decision", "DispatcherConfig", "ToolDispatcher"]

_UNRESTRICTED = Capabilities()


class ToolDispatcher:
    """Registers tools and runs tool_use blocks through validation, policy and a sandbox."""

    def __init__(
        self,
        sandbox_provider: SandboxProvider,
        *,
        config: DispatcherConfig | None = None,
        policy: ConfirmationPolicy | None = None,
        audit: AuditSink | None = None,
        observer: CallObserver = NO_OBSERVER,
        lifecycle: LifecycleHooks | None = None,
        registry: ToolRegistry | None = None,
    ) -> None:
        """``observer``: told of each finished call (metrics, traces); ``lifecycle``: what the
        sessions' clocks tell, and whom (``core/sessions/expiry.py``); ``registry``: tools
        registered already (still open: ``seal`` closes it)."""
        self.config = config or DispatcherConfig()
        self.policy = policy or ConfirmationPolicy()
        self.registry = registry if registry is not None else ToolRegistry()
        self._provider = sandbox_provider
        self._audit = audit
        self._deps = PipelineDeps(self.config, self.registry, sandbox_provider, self.policy, audit, observer)
        cfg = self.config
        self.sessions = SessionRegistry(
            concurrency=cfg.concurrency, history=cfg.event_history, history_bytes=cfg.event_history_bytes
        )
        """The one owner of the sessions' lives; the server subscribes its listeners here."""
        self.lifecycle = SessionLifecycle(
            self.sessions, self, sandbox_provider, hooks=lifecycle or LifecycleHooks()
        )
        """Their clocks: expiry, renewal, pause and resume (started by the server)."""
        self.sessions.subscribe(self.lifecycle)

    # -- registry -------------------------------------------------------------------------

    def register(self, tool_factory: ToolFactory, *, builtin: bool = False) -> None:
        """Register a tool factory (see ToolRegistry.register for what is checked)."""
        self.registry.register(tool_factory, builtin=builtin)

    def unregister(self, tool_name: str) -> None:
        self.registry.unregister(tool_name)

    def seal(self) -> None:
        """Freeze the registry; a ``timeouts:`` entry naming no registered tool is then an error.

        Raises:
            ConfigError: naming the ``timeouts.<name>`` entry.
        """
        check_timeout_names(self.config.timeouts, self.registry.list())
        self.registry.seal()

    def get_definitions_for_session(self, session: Session) -> list[ToolDefinition]:
        """Definitions this session may see: role-hidden and capability-denied tools left out, and
        ``always_prompt`` set where the session's policy makes a tool always ask."""
        caps = session.capabilities or _UNRESTRICTED
        policy = session.policy or self.policy
        return [
            replace(d, always_prompt=True) if policy.asks_always(d.name) and not d.always_prompt else d
            for d in self.registry.definitions(session.role)
            if caps.check_tool(d.name)
        ]

    # -- sessions -------------------------------------------------------------------------

    def open_session(self, session: Session) -> EventBus:
        """Open a session (already open: nothing happens) and return its event bus.

        Raises:
            UnknownSessionError: the session was closed (its id is not reused).
        """
        state = self.sessions.find(session.session_id)
        if state is None:
            self._check_not_ended(session.session_id)
            state = self.sessions.open(session)
        return state.bus

    def session(self, session_id: str) -> Session:
        """The open session's description.

        Raises:
            UnknownSessionError: the session is not open.
        """
        return self.sessions.get(session_id).session

    def broker(self, session_id: str) -> ConfirmationBroker:
        """The session's confirmation broker (its remembered answers are session state).

        Raises:
            UnknownSessionError: the session is not open.
        """
        return self.sessions.get(session_id).broker

    def session_state(self, session_id: str) -> SessionState:
        """The session's runtime state: approval mode in force, proposed plan (``core/call/approve.py``).

        Raises:
            UnknownSessionError: the session is not open.
        """
        return self.sessions.get(session_id)

    def events(self, session_id: str) -> EventBus:
        """The session's event bus.

        Raises:
            UnknownSessionError: the session is not open.
        """
        return self.sessions.get(session_id).bus

    async def close_session(self, session_id: str) -> None:
        """Cancel the session's calls, remove its sandbox and end its event streams; the registry's
        listeners are told once it has ended. Not open: nothing happens."""
        state = self.sessions.begin_close(session_id)
        if state is None:
            return
        try:
            await self._cancel_all(state)
            await self._provider.close_session(session_id)
        finally:
            self.sessions.finish_close(state)

    async def aclose(self, *, keep_sessions: bool = False) -> None:
        """Close every session and the sandbox provider.

        ``keep_sessions``: only end the sessions' event streams and leave their sandboxes to the
        provider (which must have been detached from them first), so a restart can give them back.
        """
        await self.lifecycle.aclose()
        if keep_sessions:
            self.sessions.let_go()
        for session_id in self.sessions.live_ids():
            await self.close_session(session_id)
        await self._provider.aclose()
        if self._audit is not None:
            self._audit.close()

    def sandbox_for(self, session: Session) -> Sandbox:
        """The session's sandbox (for work that is not a tool call: tree transfers).

        Raises:
            UnknownSessionError: the session is not open.
        """
        self.sessions.get(session.session_id)
        return self._provider.sandbox_for(session)

    async def processes(self, session_id: str) -> tuple[ProcessMemory, ProcessControl]:
        """The session's process table, and what the session remembers of it (its model's
        last-read cursors: ``ProcessMemory.last_read``), for the process RPCs. A paused session is
        resumed first (its processes are frozen while it is paused); after a restart, the ends of
        its running processes are followed from now on (``process.exited``).

        Raises:
            UnknownSessionError: the session is not open.
            ProcessError: ``unsupported``: its sandbox has no process table.
        """
        state = self.sessions.get(session_id)
        if state.status is SessionStatus.PAUSED:
            await self.lifecycle.ensure_running(state)
        control = self._provider.sandbox_for(state.session).processes()
        await state.processes.resume(lambda: control)
        return state.processes, control

    def audit_record(self, kind: str, **fields: Any) -> None:
        """Append to the audit log, if there is one (``fields`` already redacted)."""
        if self._audit is not None:
            self._audit.record(kind, **fields)

    def _check_not_ended(self, session_id: str) -> None:
        status = self.sessions.status(session_id)
        if status is not None:
            raise UnknownSessionError(f"session {session_id!r} is {status.value}")

    # -- cancellation and confirmation ----------------------------------------------------

    async def cancel_session_tools(self, session_id: str) -> None:
        """Cancel every in-flight call of the session; returns when they have all ended."""
        state = self.sessions.find(session_id)
        if state is not None:
            await self._cancel_all(state)

    async def _cancel_all(self, state: SessionState) -> None:
        starters = tuple(state.waiting)
        for start in starters:
            start()
        if starters:
            # New tasks run their first step, which registers the call, before this task resumes:
            # asyncio runs ready callbacks in order.
            await asyncio.sleep(0)
        await self._cancel_calls(list(state.calls))

    async def cancel_tool_uses(self, session_id: str, tool_use_ids: Sequence[str]) -> None:
        """Cancel the in-flight calls with these ids (a client went away mid-Dispatch)."""
        state = self.sessions.find(session_id)
        if state is not None:
            wanted = set(tool_use_ids)
            await self._cancel_calls([c for c in state.calls if c.tool_use_id in wanted])

    async def _cancel_calls(self, calls: list[Call]) -> None:
        for call in calls:
            call.cancel()
        if calls:
            # Each call abandons its tool after abandon_after; this bound is only a backstop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.abandon_after + 5):
                    await asyncio.gather(*(c.done.wait() for c in calls))

    def resolve_confirmation(
        self, session_id: str, request_id: str, decision: Decision, *, remember: bool = False
    ) -> tuple[bool, Decision]:
        """Answer a confirmation request; the first answer wins.

        Raises:
            UnknownSessionError: no such session.
            UnknownConfirmationError: no such request in the session.
        """
        return self.sessions.get(session_id).broker.resolve(request_id, decision, remember=remember)

    # -- staged changes (review and audit modes; core/staging/area.py) ------------------------

    def staged_changes(self, session_id: str) -> list[StagedChange]:
        """The session's staged changes, oldest first.

        Raises:
            UnknownSessionError: the session is not open.
        """
        return self.sessions.get(session_id).staging.changes()

    async def apply_staged(self, session_id: str, change_ids: Sequence[str]) -> ApplyOutcome:
        """A human applies staged changes (none named: all): per file in review mode, all or
        nothing in audit mode (``core/staging/apply.py``); published and audited.

        Raises:
            UnknownSessionError: the session is not open.
            UnknownStagedChangeError: an id names no staged change (nothing is written).
        """
        state = self.sessions.get(session_id)
        sandbox = self._provider.sandbox_for(state.session)
        audit_mode = state.mode == "audit"
        outcome = await staged_apply.apply(state.staging, sandbox, change_ids, all_or_nothing=audit_mode)
        refused = outcome.refused
        state.bus.publish(
            StagedApplied(
                change_ids=tuple(c.change_id for c in outcome.applied),
                paths=tuple(c.path for c in outcome.applied),
                refused_ids=tuple(r.change.change_id for r in refused),
                refused_paths=tuple(r.change.path for r in refused),
                refused_reasons=tuple(r.reason for r in refused),
            ),
            turn_id="",
            tool_use_id="",
        )
        self.audit_record(
            STAGED_APPLIED,
            tenant=state.session.tenant_id,
            session=session_id,
            mode=state.mode,
            applied=[{"id": c.change_id, "path": c.path} for c in outcome.applied],
            refused=[{"id": r.change.change_id, "path": r.change.path, "reason": r.reason} for r in refused],
        )
        return outcome

    async def discard_staged(self, session_id: str, change_ids: Sequence[str]) -> list[StagedChange]:
        """A human discards staged changes (none named: all); published and audited.

        Raises:
            UnknownSessionError: the session is not open.
            UnknownStagedChangeError: an id names no staged change (nothing is dropped).
        """
        state = self.sessions.get(session_id)
        dropped = await staged_apply.discard(state.staging, change_ids)
        ids, paths = tuple(c.change_id for c in dropped), tuple(c.path for c in dropped)
        state.bus.publish(StagedDiscarded(change_ids=ids, paths=paths), turn_id="", tool_use_id="")
        self.audit_record(
            STAGED_DISCARDED,
            tenant=state.session.tenant_id,
            session=session_id,
            mode=state.mode,
            discarded=[{"id": i, "path": p} for i, p in zip(ids, paths, strict=True)],
        )
        return dropped

    # -- dispatch -------------------------------------------------------------------------

    async def dispatch_all(
        self,
        tool_uses: Sequence[ToolUseBlock],
        session: Session,
        *,
        turn_id: str = "",
        ordering: Ordering | None = None,
    ) -> list[ToolResultBlock]:
        """Dispatch one assistant message's tool_uses (``ordering``, None: the configured one);
        results come back 1:1, in order."""
        order = self.message_order(tool_uses, ordering)
        return list(
            await asyncio.gather(
                *(
                    self.dispatch(t, session, turn_id=turn_id, order=order, index=i)
                    for i, t in enumerate(tool_uses)
                )
            )
        )

    def message_order(self, tool_uses: Sequence[ToolUseBlock], ordering: Ordering | None) -> MessageOrder:
        """The gates of one message's calls (``core/call/ordering.py``); None: the configured ordering."""
        changes = []
        for tool_use in tool_uses:
            registered = self.registry.get(tool_use.name)
            changes.append(registered is not None and registered.definition.side_effect in CHANGES)
        return MessageOrder(ordering or self.config.ordering, changes)

    async def dispatch(
        self,
        tool_use: ToolUseBlock,
        session: Session,
        *,
        turn_id: str = "",
        order: MessageOrder | None = None,
        index: int = 0,
    ) -> ToolResultBlock:
        """Run one tool_use through the ten steps; always returns a result, never raises a tool error.

        ``order``, ``index``: the call is ``index`` of a message run in that order (it reports its end).

        Raises:
            UnknownSessionError: the session was closed (an unknown one is opened on first use).
        """
        state = self.sessions.find(session.session_id)
        if state is None:
            try:
                self._check_not_ended(session.session_id)
            except UnknownSessionError:
                if order is not None:
                    order.ended(index)
                raise
            state = self.sessions.open(session)
        if state.status is SessionStatus.PAUSED:
            await self.lifecycle.ensure_running(state)  # the call's result says it was resumed
        call = Call(tool_use.id, turn_id)
        if state.status is SessionStatus.CLOSING:
            call.cancel()  # it came too late to run: its result says it was cancelled
        state.calls.add(call)
        run = CallRun(self._deps, state, session, tool_use, turn_id, call, order, index)
        try:
            return await run.execute()
        finally:
            state.calls.discard(call)
            call.done.set()
            if order is not None:
                order.ended(index)
