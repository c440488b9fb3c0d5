"""Sessions that survive a restart: what the server stores as they change, and gives back at start.

``SessionPersistence`` is the first listener of the session registry: a new session's row is
committed when it opens (before CreateSession answers) and deleted when it closes; every event of
a session goes to the background writer through its bus's sink; a remembered confirmation answer,
a change of container and a change of its process memory (shell state, last-read cursors) are
queued the same way. Staged changes (review and audit modes) are
committed before the call that staged them answers (the session's staging sink). At start, ``restore`` gives back every stored
session whose tenant and workspace still exist, through the one path that opens sessions, with its
event history and seq, its remembered answers, its staged changes and its container (which the sandbox provider, a
listener too, re-adopts), then a ``tool.failed`` "server restarted" event for each call that was
running. Ports open to the preview gateway are kept too (``port_changed``, committed before
OpenPort and ClosePort answer; the gateway's ``OpenPorts`` gives them back from ``stored_ports``).
``MemoryPersistence`` takes its place where nothing is kept: sessions end with the process.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.core.approval.broker import Decision
from dispatcher.core.call.approve import parse_mode
from dispatcher.core.call.settings import DispatcherConfig
from dispatcher.core.errors import FailureReason, ToolErrorClass
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import (
    TOOL_CONFIRMATION_RESOLVED,
    TOOL_STEP_PROPOSED,
    EventPayload,
    ToolFailed,
)
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.clock import SessionClock
from dispatcher.core.sessions.processes import ProcessMemory
from dispatcher.core.sessions.registry import (
    BaseSessionListener,
    Restoration,
    SessionListener,
    SessionRegistry,
)
from dispatcher.core.sessions.session import Session
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.staging.area import StagedChange
from dispatcher.core.types import Role
from dispatcher.sandbox.workspace_pin import WorkspaceRefused, open_pinned
from dispatcher.server.persistence.errors import StateError
from dispatcher.server.persistence.store import STATE_FILE, SessionStore, StoredPort, StoredSession
from dispatcher.server.persistence.stored_policy import (
    mode_in_force_from_json,
    plan_from_json,
    policy_to_json,
    remembered_from_json,
    session_fields_from_json,
)
from dispatcher.server.persistence.writer import StateWriter
from dispatcher.server.tenancy.session import build_session

if TYPE_CHECKING:
    from dispatcher.server.tenancy.tenants import Tenant, TenantDirectory


class Restores(Protocol):
    """Where the sessions given back at a start are opened (the ``SessionManager``)."""

    def restore(self, tenant: Tenant, session: Session, restored: Restoration) -> SessionState: ...


class Persistence(SessionListener, Protocol):
    """Where sessions are kept to survive a restart; the session registry's first listener."""

    def save_policy(self, state: SessionState) -> None:
        """Keep the session's policy state as it is now (remembered answers, mode in force, plan)."""
        ...

    def save_policies(self, sessions: SessionRegistry) -> None:
        """Every open session's policy state (a graceful stop: what no event announced)."""
        ...

    def container_changed(self, session_id: str, container_id: str | None) -> None: ...

    def clock_changed(self, state: SessionState) -> None:
        """Keep the session's clocks as they are now (renewed, paused, resumed, last activity)."""
        ...

    def restore(self, manager: Restores, tenants: TenantDirectory) -> None:
        """Give back, through ``manager``, the sessions kept by the previous run.

        Raises:
            StateError: what was kept cannot be read.
        """
        ...

    def port_changed(self, session_id: str, port: int, row: StoredPort | None) -> Future[None]:
        """Keep a preview port opened (``row``) or closed (None); done once it would survive a kill."""
        ...

    def stored_ports(self) -> list[StoredPort]:
        """The preview ports kept by the previous run (unreadable rows skipped and deleted)."""
        ...

    def ports_dropped(self, keys: Iterable[tuple[str, int]]) -> None:
        """Forget stored preview ports that are not given back, by (session id, port)."""
        ...

    def close(self) -> None:
        """Keep what is still queued and let go of the store."""
        ...


class MemoryPersistence(BaseSessionListener):
    """Keeps nothing beyond the registry itself: sessions end with the process."""

    def save_policy(self, state: SessionState) -> None:
        pass

    def save_policies(self, sessions: SessionRegistry) -> None:
        pass

    def container_changed(self, session_id: str, container_id: str | None) -> None:
        pass

    def clock_changed(self, state: SessionState) -> None:
        pass

    def restore(self, manager: Restores, tenants: TenantDirectory) -> None:
        pass

    def port_changed(self, session_id: str, port: int, row: StoredPort | None) -> Future[None]:
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def stored_ports(self) -> list[StoredPort]:
        return []

    def ports_dropped(self, keys: Iterable[tuple[str, int]]) -> None:
        pass

    def close(self) -> None:
        pass


IN_MEMORY = MemoryPersistence()
"""Stateless, so one serves every manager that keeps nothing."""


log = logging.getLogger("dispatcher.server.persistence.state")

RESTARTED = FailureReason.SERVER_RESTARTED
RESTARTED_MESSAGE = (
    "server restarted: the call was running when the server stopped, and its result was never delivered"
)


class SessionPersistence(BaseSessionListener):
    """The link between the open sessions and ``<home>/state.db``."""

    def __init__(self, store: SessionStore, writer: StateWriter) -> None:
        self.store = store
        self.writer = writer

    @classmethod
    def open(cls, home: Path, config: DispatcherConfig) -> SessionPersistence:
        """Open ``<home>/state.db`` and start its writer (keeping as much history as ``config``'s
        event buses do).

        Raises:
            StateError: the file is damaged or of a newer schema (naming it).
        """
        store = SessionStore.open(home / STATE_FILE)
        writer = StateWriter(store, history=config.event_history, history_bytes=config.event_history_bytes)
        return cls(store, writer)

    def close(self) -> None:
        """Commit what is queued and close the file (graceful stop)."""
        self.writer.close()

    # -- as sessions change (a listener of the session registry) ------------------------------

    def session_opened(self, state: SessionState) -> None:
        """Store a new session (synchronously: it must exist before it is acknowledged)."""
        s = state.session
        self.store.put_session(
            StoredSession(
                session_id=s.session_id,
                tenant_id=s.tenant_id,
                workspace=s.workspace_name,
                workspace_path=s.workspace_path,
                role=s.role.value,
                labels=dict(s.labels),
                create_time=state.create_time,
                policy=policy_to_json({}, s),
                lifecycle=state.clock.to_json(),
                processes=state.processes.to_json(),
            )
        )
        self._attach(state, ())

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        """A session given back is stored already: only follow its events and changes from now on."""
        self._attach(state, restored.events)

    def session_closed(self, state: SessionState) -> None:
        """Forget a closed session: its row, events, running calls."""
        self.writer.forget([state.session.session_id])

    def _attach(self, state: SessionState, stored_events: tuple[Event, ...]) -> None:
        sid = state.session.session_id
        self.writer.track(sid, stored_events)
        state.bus.sink = self._sink(state)
        state.staging.sink = self
        state.processes.on_change = lambda: self.processes_changed(state)

    # -- staged changes (a StagingSink): committed before the call or the RPC answers -----------

    async def change_staged(self, session_id: str, change: StagedChange) -> None:
        await asyncio.to_thread(self.store.put_staged, session_id, change)

    async def changes_removed(self, session_id: str, change_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.store.delete_staged, session_id, change_ids)

    def container_changed(self, session_id: str, container_id: str | None) -> None:
        self.writer.update(session_id, "container_id", container_id)

    def clock_changed(self, state: SessionState) -> None:
        self.writer.update(state.session.session_id, "lifecycle", state.clock.to_json())

    def port_changed(self, session_id: str, port: int, row: StoredPort | None) -> Future[None]:
        return self.writer.port_changed(session_id, port, row)

    def stored_ports(self) -> list[StoredPort]:
        return self.store.load_ports()

    def ports_dropped(self, keys: Iterable[tuple[str, int]]) -> None:
        self.store.delete_ports(keys)

    def processes_changed(self, state: SessionState) -> None:
        """Keep the session's shell state and last-read cursors as they are now."""
        if state.status.alive:
            self.writer.update(state.session.session_id, "processes", state.processes.to_json())

    def _sink(self, state: SessionState) -> Callable[[Event], None]:
        on_event = self.writer.on_event
        loop = asyncio.get_running_loop()

        def sink(event: Event) -> None:
            on_event(event)
            if event.type in (TOOL_CONFIRMATION_RESOLVED, TOOL_STEP_PROPOSED):
                # The call remembers the answer (records the step) around this event: read it after.
                loop.call_soon(self.save_policy, state)

        return sink

    def save_policy(self, state: SessionState) -> None:
        """Queue the session's policy state as it is now (remembered answers, mode in force); a
        session no longer open has nothing more to keep."""
        if not state.status.alive:
            return
        answers = state.broker.remembered_answers()
        remembered = {tool: decision.value for tool, decision in answers.items()}
        policy = policy_to_json(remembered, state.session, state.mode, state.plan)
        self.writer.update(state.session.session_id, "policy", policy)

    def save_policies(self, sessions: SessionRegistry) -> None:
        """Every open session's policy state (a graceful stop: what no event announced)."""
        for session_id in self.writer.live_ids():
            state = sessions.find(session_id)
            if state is not None:
                self.save_policy(state)
                self.clock_changed(state)
                self.processes_changed(state)

    # -- at start -------------------------------------------------------------------------

    def restore(self, manager: Restores, tenants: TenantDirectory) -> None:
        """Give back the stored sessions through ``manager``.

        Sessions whose tenant is no longer configured, or whose workspace is gone or is no longer
        a plain directory, are closed (their rows deleted, their containers left to the orphan
        sweep) with a log line each.

        Raises:
            StateError: the file cannot be read.
        """
        dropped: list[str] = []
        for row in self.store.load():
            try:
                tenant = tenants.get(row.tenant_id)
            except KeyError:
                tenant = None
            problem = "its tenant is no longer configured" if tenant is None else None
            path = None
            if tenant is not None:
                path, problem = _check_workspace(tenant, row.workspace)
                problem = problem or _mode_problem(tenant, row.policy)
            if problem is not None or tenant is None or path is None:
                log.warning(
                    "stored session closed: %s",
                    problem,
                    extra={
                        "session_id": row.session_id,
                        "tenant_id": row.tenant_id,
                        "workspace": row.workspace,
                    },
                )
                dropped.append(row.session_id)
                continue
            self._reopen(manager, tenant, row, path)
        self.writer.forget(dropped)

    def _reopen(self, manager: Restores, tenant: Tenant, row: StoredSession, path: str) -> None:
        session, restored = self._restoration(tenant, row, path)
        bus = manager.restore(tenant, session, restored).bus
        self.writer.running_stored(row.session_id, (call.tool_use_id for call in row.running))
        for call in row.running:
            bus.publish(
                ToolFailed(
                    tool_name=call.tool_name,
                    error_class=ToolErrorClass.EXECUTION_ERROR.value,
                    message=RESTARTED_MESSAGE,
                    duration_ms=0.0,
                    reason=RESTARTED,
                ),
                turn_id=call.turn_id,
                tool_use_id=call.tool_use_id,
            )
        log.info(
            "stored session given back",
            extra={
                "session_id": row.session_id,
                "tenant_id": row.tenant_id,
                "running_calls": len(row.running),
            },
        )

    def _restoration(self, tenant: Tenant, row: StoredSession, path: str) -> tuple[Session, Restoration]:
        """The session as its tenant allows it now, and what it is given back with.

        Raises:
            StateError: the row is damaged.
        """
        try:
            role = Role(row.role)
            fields = session_fields_from_json(row.policy)
            if "approval_mode" in fields:
                fields["approval_mode"] = parse_mode(fields["approval_mode"])
            in_force = mode_in_force_from_json(row.policy)
            mode = parse_mode(in_force) if in_force is not None else None
            clock = SessionClock.from_json(row.lifecycle) if row.lifecycle else None
            ProcessMemory(_unpublished).restore(row.processes)  # checked here: a damaged one stops the start
        except ValueError as exc:
            raise StateError(f"{self.store.path}: session {row.session_id!r} is damaged: {exc}") from None
        session = build_session(tenant, row.session_id, row.workspace, path, role, row.labels, **fields)
        remembered = remembered_from_json(row.policy)
        return session, Restoration(
            create_time=row.create_time,
            last_seq=row.last_seq,
            events=tuple(row.events),
            remembered={tool: Decision(value) for tool, value in remembered.items()},
            mode=mode,
            plan=tuple(plan_from_json(row.policy)),
            container_id=row.container_id,
            staged=tuple(row.staged),
            clock=clock,
            processes=row.processes,
        )


def _unpublished(payload: EventPayload, tool_use_id: str) -> None:
    """Where a process memory built only to check a stored one would publish: nowhere."""


def _mode_problem(tenant: Tenant, policy: Mapping[str, Any]) -> str | None:
    """Why a stored session may not run again under its tenant's ``approval_modes`` as they are now
    (a mode no longer allowed is never kept on); None: it may."""
    for name in (policy.get("approval_mode"), mode_in_force_from_json(policy)):
        if isinstance(name, str) and name and name.lower() not in tenant.approval_modes:
            return f"its approval mode {name!r} is no longer allowed for its tenant"
    return None


def _check_workspace(tenant: Tenant, name: str) -> tuple[str | None, str | None]:
    """(real path, None) when the workspace is still a plain directory under the tenant's root,
    reached without following a link; (None, why) otherwise."""
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if not parts or any(p in ("..", "/") for p in parts):
        return None, f"its stored workspace name {name!r} is not valid"
    real_root = os.path.realpath(tenant.workspace_root)
    try:
        fd = open_pinned(real_root, parts, create=False, owner=None, what=f"workspace {name!r}")
    except WorkspaceRefused:
        return None, f"its workspace {name!r} is no longer a directory (a symlink or a file is in the way)"
    except SandboxError as exc:
        return None, f"its workspace {name!r} cannot be opened: {exc}"
    if fd is None:
        return None, f"its workspace {name!r} is gone"
    os.close(fd)
    return os.path.join(real_root, *parts), None
