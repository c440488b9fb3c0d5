"""The one owner of a session's life: which sessions exist, where each is in its life, and who is told.

Every "is this session open?" is answered here (``get``). A session is opened new or given back
after a restart by the same ``open``; what else must happen then (storing it, starting its
sandbox, counting it) is done by listeners that subscribed, told in their subscription order:

- ``session_opened``: a new session. A listener that raises undoes the open: the listeners already
  told are told ``session_closed`` (in reverse), the session is dropped and the error goes to the
  caller (a session that could not be stored is never acknowledged).
- ``session_restored``: a session a restarted server gives back, with what was stored. Instead of
  ``session_opened``, so that persistence does not write again what it just read. Errors as above.
- ``session_closed``: in reverse subscription order (the first to know is the last to forget).
  Every listener is told even when one raises (logged): a listener cannot keep a session open.

``OPEN -> CLOSING -> CLOSED``, ``OPEN <-> PAUSED``, and ``-> CLOSING -> EXPIRED`` when a clock ran out
(``SessionStatus``). The work of closing (cancelling calls, stopping the sandbox) is the
dispatcher's, between ``begin_close`` and ``finish_close``; pausing and expiring are
``core/sessions/expiry.py``'s, which sets the states here (``set_paused``, and ``begin_close`` with
the expiry). An ended session is remembered (with its tenant, and when and why it expired) so that a
late request is told what became of it.

Leaving life is one step: ``begin_close`` takes the session out of the open ones and records how it
ended, together. Stopping a sandbox takes a while (a container: tens of milliseconds); a reader in
that time is told the session expired (or was closed), never that there is no such session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from dispatcher.core.approval.broker import Decision
from dispatcher.core.errors import UnknownSessionError
from dispatcher.core.events.bus import Event, EventBus
from dispatcher.core.sessions.clock import ExpiryReason, Lifetime, SessionClock
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.core.sessions.state import PlanStep, SessionState
from dispatcher.core.staging.area import StagedChange

__all__ = ["BaseSessionListener", "Restoration", "SessionListener", "SessionRegistry", "SessionStatus"]

log = logging.getLogger("dispatcher.core.sessions")

ENDED_IDS_KEPT = 10_000
"""Ended session ids remembered (oldest forgotten first): a late dispatch must not silently bring
a closed session back, and its caller is told it was closed rather than that it never existed."""


@dataclass(frozen=True, slots=True)
class Restoration:
    """What a restarted server gives a session back with (read from the store, already checked)."""

    create_time: float
    last_seq: int = 0
    """The last event seq the previous life gave: the bus goes on after it."""
    events: tuple[Event, ...] = ()
    """The retained event history, oldest first (replayed to watchers)."""
    remembered: Mapping[str, Decision] = field(default_factory=dict)
    """Confirmation answers remembered for the rest of the session, per tool."""
    mode: str | None = None
    """The approval mode in force when it differs from the session's own (an approved plan)."""
    plan: tuple[PlanStep, ...] = ()
    container_id: str | None = None
    """The sandbox container the previous life used (re-adopted by the provider)."""
    staged: tuple[StagedChange, ...] = ()
    """The changes it had staged and nobody applied or discarded yet (``core/staging/area.py``)."""
    clock: SessionClock | None = None
    """Its clocks as stored (None: a row written before sessions had clocks: none run)."""
    processes: Mapping[str, Any] | None = None
    """Its shell's state and last-read cursors (``ProcessMemory.to_json``; None: none stored)."""


@dataclass(frozen=True, slots=True)
class Ended:
    """What is remembered of an ended session."""

    status: SessionStatus
    tenant_id: str
    expired: tuple[float, ExpiryReason] | None = None
    """When and by which clock it expired."""

    def message(self, session_id: str) -> str:
        if self.expired is not None:
            when, reason = self.expired
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
            return f"session {session_id!r} expired at {stamp} ({reason.value})"
        return f"session {session_id!r} is {self.status.value}"


class SessionListener(Protocol):
    """Told of sessions' lives by the registry; see the module docstring for the order and errors."""

    def session_opened(self, state: SessionState) -> None: ...

    def session_restored(self, state: SessionState, restored: Restoration) -> None: ...

    def session_closed(self, state: SessionState) -> None: ...


class BaseSessionListener:
    """A listener that ignores every event: subclass it and override what matters to you (events
    added later then need no change in listeners that do not care)."""

    def session_opened(self, state: SessionState) -> None:
        """A new session is open."""

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        """A session is open again after a restart, with what was stored."""

    def session_closed(self, state: SessionState) -> None:
        """The session has ended (its calls are over and its sandbox is stopped)."""


class SessionRegistry:
    """The sessions of one dispatcher, by id, with their state and their listeners."""

    def __init__(self, *, concurrency: int = 4, history: int = 10_000, history_bytes: int = 8 << 20) -> None:
        """Each session's calls run at most ``concurrency`` at a time; its event bus replays at most
        ``history`` events and ``history_bytes`` bytes (``DispatcherConfig``)."""
        self._concurrency = concurrency
        self._history = history
        self._history_bytes = history_bytes
        self._live: dict[str, SessionState] = {}
        self._ended: OrderedDict[str, Ended] = OrderedDict()
        self._listeners: list[SessionListener] = []

    def subscribe(self, *listeners: SessionListener) -> None:
        """Add listeners, told after those already subscribed (and closed before them)."""
        self._listeners.extend(listeners)

    # -- opening ----------------------------------------------------------------------------

    def open(
        self,
        session: Session,
        *,
        create_time: float | None = None,
        restored: Restoration | None = None,
        lifetime: Lifetime | None = None,
    ) -> SessionState:
        """Open ``session`` (new, under the clocks of ``lifetime``, or with ``restored`` what a restart
        gives back) and tell the listeners.

        Raises:
            ValueError: a session with this id is already open or closing.
            Exception: whatever a listener raised (the session is then not open).
        """
        sid = session.session_id
        if sid in self._live:
            raise ValueError(f"session {sid!r} is already open")
        state = self._new_state(session, create_time, restored)
        if restored is None or restored.clock is None:  # new, or stored before sessions had clocks
            state.clock = SessionClock.start(lifetime, state.create_time)  # lifecycle.py restarts it
        else:
            state.clock = restored.clock
            if restored.clock.paused is not None:
                state.status = SessionStatus.PAUSED
        self._ended.pop(sid, None)
        self._live[sid] = state
        told: list[SessionListener] = []
        try:
            for listener in self._listeners:
                if restored is None:
                    listener.session_opened(state)
                else:
                    listener.session_restored(state, restored)
                told.append(listener)
        except BaseException:
            log.warning("opening session %s failed in a listener: undone", sid)
            self._end(state, reversed(told))
            raise
        return state

    def _new_state(
        self, session: Session, create_time: float | None, restored: Restoration | None
    ) -> SessionState:
        bus = EventBus(
            session.session_id,
            history=self._history,
            history_bytes=self._history_bytes,
            start_seq=restored.last_seq if restored is not None else 0,
        )
        if create_time is None:
            create_time = restored.create_time if restored is not None else time.time()
        state = SessionState(session, bus, asyncio.Semaphore(self._concurrency), create_time=create_time)
        if restored is not None:
            bus.restore(restored.events)
            state.broker.restore_remembered(dict(restored.remembered))
            state.plan[:] = restored.plan
            state.staging.restore(restored.staged)
            if restored.mode is not None:
                state.mode = restored.mode
            if restored.processes is not None:
                state.processes.restore(restored.processes)
        return state

    # -- the one answer to "is it open?" -----------------------------------------------------

    def get(self, session_id: str) -> SessionState:
        """The open session.

        Raises:
            UnknownSessionError: it is not open (never was, or has ended: closing counts as ended),
                saying how it ended.
        """
        state = self._live.get(session_id)
        if state is not None and state.status.alive:
            return state
        raise UnknownSessionError(self.why_gone(session_id))

    def why_gone(self, session_id: str) -> str:
        """What to tell a request for a session that is not open: expired when and why, closed,
        or unknown."""
        ended = self._ended.get(session_id)
        if ended is None:
            return f"unknown session {session_id!r}"
        return ended.message(session_id)

    def ended(self, session_id: str) -> Ended | None:
        """How the session ended, from the moment it began closing (None: not ended, or forgotten)."""
        return self._ended.get(session_id)

    def is_open(self, session_id: str) -> bool:
        """It takes requests (open or paused)."""
        state = self._live.get(session_id)
        return state is not None and state.status.alive

    def status(self, session_id: str) -> SessionStatus | None:
        """Where the session is in its life; None: never seen (or ended too long ago)."""
        state = self._live.get(session_id)
        if state is not None:
            return state.status
        ended = self._ended.get(session_id)
        return ended.status if ended is not None else None

    def find(self, session_id: str) -> SessionState | None:
        """The session if it is not over yet (open or closing): for work that must reach it while it
        closes (cancelling its calls)."""
        return self._live.get(session_id)

    def __iter__(self) -> Iterator[SessionState]:
        """The open and paused sessions (not those closing)."""
        return (s for s in tuple(self._live.values()) if s.status.alive)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def count(self, tenant_id: str) -> int:
        """The tenant's open sessions and those still closing (they hold a sandbox until closed)."""
        return sum(1 for s in self._live.values() if s.session.tenant_id == tenant_id)

    def live_ids(self) -> list[str]:
        """Every session not over yet, closing ones included."""
        return list(self._live)

    def by_status(self) -> dict[SessionStatus, int]:
        """How many sessions are in each state now (metrics)."""
        out: dict[SessionStatus, int] = {}
        for state in self._live.values():
            out[state.status] = out.get(state.status, 0) + 1
        return out

    # -- pausing (core/sessions/expiry.py) -----------------------------------------------------

    def set_paused(self, state: SessionState, paused: bool) -> None:
        """An alive session becomes paused (or open again); a closing one stays closing."""
        if state.status.alive:
            state.status = SessionStatus.PAUSED if paused else SessionStatus.OPEN

    # -- closing ----------------------------------------------------------------------------

    def begin_close(
        self, session_id: str, *, expired: tuple[float, ExpiryReason] | None = None
    ) -> SessionState | None:
        """In one step, take the session out of the open ones and remember how it ended: closed,
        or ``expired`` (when, by which clock). The closing one if it already was (its end stays
        the first one given); None if it is not open."""
        state = self._live.get(session_id)
        if state is not None and state.status.alive:
            state.status = SessionStatus.CLOSING
            ending = SessionStatus.CLOSED if expired is None else SessionStatus.EXPIRED
            self._remember(session_id, Ended(ending, state.session.tenant_id, expired))
        return state

    def finish_close(self, state: SessionState) -> None:
        """The session has ended: forget it, remember that it was closed, tell the listeners (once)."""
        if self._live.get(state.session.session_id) is state:
            self._end(state, reversed(self._listeners))

    def let_go(self) -> None:
        """Forget every session without closing it and without telling anyone (a stop that keeps
        the sessions stored for the next start); their event streams end."""
        states, self._live = list(self._live.values()), {}
        for state in states:
            state.processes.close()
            state.bus.close()

    def _remember(self, session_id: str, ended: Ended) -> None:
        self._ended[session_id] = ended
        self._ended.move_to_end(session_id)
        while len(self._ended) > ENDED_IDS_KEPT:
            self._ended.popitem(last=False)

    def _end(self, state: SessionState, listeners: Iterator[SessionListener]) -> None:
        sid = state.session.session_id
        # Recorded by begin_close; an open undone by its listeners (or a close never begun) is closed.
        ended = self._ended.get(sid) if state.status is SessionStatus.CLOSING else None
        if ended is None:
            ended = Ended(SessionStatus.CLOSED, state.session.tenant_id)
        state.status = ended.status
        self._live.pop(sid, None)
        self._remember(sid, ended)
        state.processes.close()
        state.bus.close()
        for listener in listeners:
            try:
                listener.session_closed(state)
            except Exception:
                log.exception("a listener failed on session %s's close", sid, extra={"session_id": sid})
