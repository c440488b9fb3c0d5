"""Sessions' clocks at work: expiry by TTL or idleness, renewal, pause and resume.

A listener of the session registry: a session opened (or given back after a restart) gets its next
deadline in the one ``DeadlineScheduler``; a closed one loses it. When a deadline comes, the
session is looked at again as it is then (activity moves the idle deadline without touching the
heap: the entry fires, finds the session busy or recently used, and is set again):

- **Activity** is any request on the session (``touch``), a call in flight or a Dispatch or
  transfer holding the session (``hold``), and a process still running in the sandbox (asked of the
  provider, ``working``: the agent's process count). A session with work in flight never expires
  by idleness; its TTL still bounds it. Watching is not activity.
- ``session.expiring`` is published once per deadline, ``warn_before`` seconds ahead.
- Expiry by TTL cancels the running calls as CancelSessionTools does (their partial output kept in
  their results), then the session closes (remembered as expired) or, with ``on_expire: pause``,
  pauses. Paused by its TTL, a session gets a fresh TTL when it resumes.
- Pause freezes the sandbox (``provider.pause``) and stops the idle clock; the TTL runs on.
  ``resume`` thaws it: asked for, or transparently by the next call (whose result says so).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dispatcher.core.events.payloads import SessionExpired, SessionExpiring, SessionPaused, SessionResumed
from dispatcher.core.sessions.clock import MAX_CLOCK_SECONDS, ExpiryReason, OnExpire, SessionClock
from dispatcher.core.sessions.deadlines import DeadlineScheduler
from dispatcher.core.sessions.registry import BaseSessionListener, Restoration, SessionRegistry
from dispatcher.core.sessions.session import SessionStatus

if TYPE_CHECKING:
    from dispatcher.core.provider_api import SandboxProvider
    from dispatcher.core.sessions.state import SessionState

__all__ = ["LifecycleHooks", "LifecycleObserver", "SessionLifecycle"]

log = logging.getLogger("dispatcher.core.lifecycle")  # the name operators know; kept across the move

RESUMED_NOTICE = (
    "the session was paused and has been resumed for this call: its /tmp files and the processes"
    " left running in it are as they were"
)
"""The first line of the result of a call that resumed a paused session."""
WORKING_TIMEOUT = 10.0
"""Longest wait for a sandbox to say whether processes run in it (no answer: it is kept)."""
EXPIRY_WORKERS = 16
"""Due sessions handled at once: a pass over 1,000 does not start 1,000 sandbox queries."""


class LifecycleObserver(Protocol):
    """Told of expirations, pauses and resumes (metrics)."""

    def session_expired(self, reason: ExpiryReason) -> None: ...
    def session_paused(self, reason: ExpiryReason) -> None: ...
    def session_resumed(self, reason: ExpiryReason) -> None: ...


class _Nothing:
    def session_expired(self, reason: ExpiryReason) -> None:
        pass

    def session_paused(self, reason: ExpiryReason) -> None:
        pass

    def session_resumed(self, reason: ExpiryReason) -> None:
        pass


@dataclass(frozen=True, slots=True)
class LifecycleHooks:
    """What the sessions' clocks are given at construction by whoever runs them (a server)."""

    warn_before: float = 300.0
    """Seconds ahead of a deadline at which ``session.expiring`` is published (0: never)."""
    observer: LifecycleObserver | None = None
    """Told of expirations, pauses and resumes (metrics); None: nobody."""
    on_change: Callable[[SessionState], None] | None = None
    """Told when a session's clock changed in a way worth storing (persistence); None: nobody."""


class Closer(Protocol):
    """What the lifecycle asks of the dispatcher."""

    async def close_session(self, session_id: str) -> None: ...
    async def cancel_session_tools(self, session_id: str) -> None: ...


class SessionLifecycle(BaseSessionListener):
    """The clocks of every session of one registry, on one scheduler."""

    def __init__(
        self,
        registry: SessionRegistry,
        closer: Closer,
        provider: SandboxProvider,
        *,
        clock: Callable[[], float] = time.time,
        hooks: LifecycleHooks = LifecycleHooks(),
    ) -> None:
        self._registry = registry
        self._closer = closer
        self._provider = provider
        self.clock = clock
        self.warn_before = hooks.warn_before
        self.observer: LifecycleObserver = hooks.observer or _Nothing()
        self.on_change = hooks.on_change
        """Told when a session's clock changed in a way worth storing (persistence)."""
        self._scheduler: DeadlineScheduler[str] = DeadlineScheduler(clock)
        self._held: collections.Counter[str] = collections.Counter()
        self._locks: dict[str, asyncio.Lock] = {}
        self._stored_activity: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    # -- running ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler task (once; within the running loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._scheduler.run(self.handle_due), name="session-expiry"
            )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._scheduler.stop_handling()

    def scheduled(self, session_id: str) -> float | None:
        """When the session is next looked at (tests, bench)."""
        return self._scheduler.deadline(session_id)

    # -- SessionListener --------------------------------------------------------------------

    def session_opened(self, state: SessionState) -> None:
        # The clocks start on this lifecycle's clock (the first listener: stored as started here).
        state.clock = SessionClock.start(state.clock.lifetime, self.clock())
        self._schedule(state)

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        if restored.clock is None:
            # Stored before sessions had clocks: its clocks start now, and are stored.
            state.clock = SessionClock.start(state.clock.lifetime, self.clock())
            self._changed(state)
        elif state.clock.bound(self.clock()):
            # Stored by a server that took any number: kept within the bound, and stored so.
            log.warning(
                "session %s: its stored clocks were past %d s, cut to it",
                state.session.session_id,
                MAX_CLOCK_SECONDS,
                extra={"session_id": state.session.session_id},
            )
            self._changed(state)
        self._stored_activity[state.session.session_id] = state.clock.last_activity
        self._schedule(state)

    def session_closed(self, state: SessionState) -> None:
        sid = state.session.session_id
        self._scheduler.cancel(sid)
        self._held.pop(sid, None)
        self._locks.pop(sid, None)
        self._stored_activity.pop(sid, None)

    # -- activity ---------------------------------------------------------------------------

    def touch(self, state: SessionState) -> None:
        """A request on the session: its idle clock starts again (no heap work: see the module)."""
        now = self.clock()
        clock = state.clock
        clock.last_activity = now
        clock.warned.discard(ExpiryReason.IDLE.value)
        idle = clock.lifetime.idle_timeout_seconds
        # Stored now and then (a tenth of the idle timeout): a restart after a kill -9 then expires
        # it at most that much early, and no request pays a write.
        stored = self._stored_activity.get(state.session.session_id, 0.0)
        if idle > 0 and now - stored >= idle / 10:
            self._changed(state)

    def hold(self, state: SessionState) -> Held:
        """Work on the session (a Dispatch, a transfer): it is busy for the ``async with`` block,
        resumed first if paused (``notice``: the call's result says so)."""
        return Held(self, state)

    def _hold(self, state: SessionState) -> None:
        self.touch(state)
        self._held[state.session.session_id] += 1

    def _release(self, state: SessionState) -> None:
        sid = state.session.session_id
        self._held[sid] -= 1
        if self._held[sid] <= 0:
            self._held.pop(sid, None)
        self.touch(state)

    def _busy(self, state: SessionState) -> bool:
        return bool(state.calls or state.waiting or self._held.get(state.session.session_id))

    async def _working(self, state: SessionState) -> bool:
        """Busy here, or processes still run in its sandbox (a background job is work)."""
        if self._busy(state):
            return True
        try:
            async with asyncio.timeout(WORKING_TIMEOUT):
                return await self._provider.working(state.session.session_id)
        except Exception as exc:  # cannot tell: keep it, ask again at the next deadline
            log.warning("session %s: cannot tell whether it works: %s", state.session.session_id, exc)
            return True

    # -- renew, pause, resume ------------------------------------------------------------------

    def renew(self, state: SessionState, ttl_seconds: float) -> None:
        """A new absolute expiry ``ttl_seconds`` from now (0: none); the caller checked the maximum."""
        state.clock.renew(ttl_seconds, self.clock())
        self.touch(state)
        self._changed(state)
        self._schedule(state)

    async def pause(self, state: SessionState, reason: ExpiryReason = ExpiryReason.REQUEST) -> bool:
        """Freeze the session's sandbox, its running calls cancelled first; False if it already was."""
        sid = state.session.session_id
        await self._closer.cancel_session_tools(sid)
        async with self._lock(sid):
            if state.status is not SessionStatus.OPEN:
                return False
            self._registry.set_paused(state, True)
            state.clock.paused = reason
            if reason is ExpiryReason.TTL:
                state.clock.expire_time = None  # it ran out: a fresh TTL starts at resume
            try:
                await self._provider.pause(sid)
            except Exception as exc:  # nothing to freeze (gone): the next call starts a fresh one
                log.warning("session %s: pausing its sandbox failed: %s", sid, exc)
            state.bus.publish(SessionPaused(reason.value), turn_id="", tool_use_id="")
            self.observer.session_paused(reason)
            self._changed(state)
            self._schedule(state)
        log.info("session paused", extra={"session_id": sid, "reason": reason.value})
        return True

    async def resume(
        self, state: SessionState, reason: ExpiryReason = ExpiryReason.REQUEST, *, notice: str | None = None
    ) -> bool:
        """Thaw a paused session (``notice``: what the next call's result says); False if it was not."""
        sid = state.session.session_id
        async with self._lock(sid):
            if state.status is not SessionStatus.PAUSED:
                return False
            await self._provider.resume(sid, notice=notice)
            was, state.clock.paused = state.clock.paused, None
            ttl = state.clock.lifetime.ttl_seconds
            if was is ExpiryReason.TTL and ttl > 0:
                state.clock.renew(ttl, self.clock())
            self._registry.set_paused(state, False)
            state.bus.publish(SessionResumed(reason.value), turn_id="", tool_use_id="")
            self.observer.session_resumed(reason)
            self.touch(state)
            self._changed(state)
            self._schedule(state)
        log.info("session resumed", extra={"session_id": sid, "reason": reason.value})
        return True

    async def ensure_running(self, state: SessionState) -> None:
        """Resume a paused session for the work about to use it, saying so in its result."""
        if state.status is SessionStatus.PAUSED:
            await self.resume(state, ExpiryReason.REQUEST, notice=RESUMED_NOTICE)

    # -- deadlines ----------------------------------------------------------------------------

    def _lock(self, session_id: str) -> asyncio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = asyncio.Lock()
        return lock

    def _changed(self, state: SessionState) -> None:
        self._stored_activity[state.session.session_id] = state.clock.last_activity
        if self.on_change is not None:
            self.on_change(state)

    def _next(self, state: SessionState) -> float | None:
        """When the session must next be looked at: a warning or an expiry, whichever is first."""
        clock = state.clock
        # The end of its life: also when paused by its TTL (no expiry then), it must not outlive it.
        times: list[float] = [] if clock.end_time is None else [clock.end_time]
        for reason, at in (
            (ExpiryReason.TTL, clock.expire_time),
            (ExpiryReason.IDLE, clock.idle_expire_time),
        ):
            if at is None:
                continue
            times.append(at)
            if self.warn_before > 0 and reason.value not in clock.warned:
                times.append(at - self.warn_before)
        return min(times, default=None)

    def _schedule(self, state: SessionState) -> None:
        sid = state.session.session_id
        when = self._next(state)
        if when is None:
            self._scheduler.cancel(sid)
        else:
            self._scheduler.set(sid, when)

    async def handle_due(self, session_ids: list[str]) -> None:
        """Look at each due session now: expire, warn or put it back (a few at a time)."""
        slots = asyncio.Semaphore(EXPIRY_WORKERS)

        async def one(sid: str) -> None:
            async with slots:
                state = self._registry.find(sid)
                if state is None or not state.status.alive:
                    return
                try:
                    await self._look_at(state)
                except Exception:
                    log.exception("session %s: handling its deadline failed", sid, extra={"session_id": sid})
                    self._schedule(state)

        await asyncio.gather(*(one(sid) for sid in session_ids))

    async def _look_at(self, state: SessionState) -> None:
        now = self.clock()
        clock = state.clock
        if clock.past_end(now) or (clock.expire_time is not None and now >= clock.expire_time):
            await self.expire(state, ExpiryReason.TTL)
            return
        idle_at = clock.idle_expire_time
        if idle_at is not None and now >= idle_at:
            if await self._working(state):
                self._active_now(state)
            else:
                await self.expire(state, ExpiryReason.IDLE)
                return
        self._warn(state, now)
        self._schedule(state)

    def _active_now(self, state: SessionState) -> None:
        """Seen working at a deadline: that is activity, stored (a restart counts from it)."""
        state.clock.last_activity = self.clock()
        state.clock.warned.discard(ExpiryReason.IDLE.value)
        self._changed(state)

    def _warn(self, state: SessionState, now: float) -> None:
        clock = state.clock
        for reason, at in (
            (ExpiryReason.TTL, clock.expire_time),
            (ExpiryReason.IDLE, clock.idle_expire_time),
        ):
            if at is None or reason.value in clock.warned or now < at - self.warn_before:
                continue
            if reason is ExpiryReason.IDLE and self._busy(state):
                self._active_now(state)
                continue
            clock.warned.add(reason.value)
            payload = SessionExpiring(reason.value, max(at - now, 0.0), at)
            state.bus.publish(payload, turn_id="", tool_use_id="")

    async def expire(self, state: SessionState, reason: ExpiryReason) -> None:
        """A clock ran out: cancel the calls, then close (remembered as expired) or pause; a session
        past the end of its life (its tenant's maximum) closes whatever ``on_expire`` says."""
        sid = state.session.session_id
        log.info("session expired", extra={"session_id": sid, "reason": reason.value})
        self.observer.session_expired(reason)
        if state.clock.lifetime.on_expire is OnExpire.PAUSE and not state.clock.past_end(self.clock()):
            state.bus.publish(SessionExpired(reason.value), turn_id="", tool_use_id="")
            if state.status is SessionStatus.PAUSED:
                state.clock.expire_time = None  # its TTL ran out while paused: it stays paused
                self._changed(state)
                self._schedule(state)
            else:
                await self.pause(state, reason)
            return
        await self._closer.cancel_session_tools(sid)
        state.bus.publish(SessionExpired(reason.value), turn_id="", tool_use_id="")
        # Ended from here on for every reader, with when and why, while its sandbox stops.
        self._registry.begin_close(sid, expired=(self.clock(), reason))
        await self._closer.close_session(sid)


class Held:
    """``SessionLifecycle.hold``: a class rather than a generator, because every Dispatch enters one."""

    __slots__ = ("_lifecycle", "_state")

    def __init__(self, lifecycle: SessionLifecycle, state: SessionState) -> None:
        self._lifecycle = lifecycle
        self._state = state

    async def __aenter__(self) -> None:
        self._lifecycle._hold(self._state)
        try:
            await self._lifecycle.ensure_running(self._state)
        except BaseException:
            self._lifecycle._release(self._state)
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._lifecycle._release(self._state)
