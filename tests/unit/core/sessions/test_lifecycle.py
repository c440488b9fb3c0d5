"""Session clocks with a made-up clock: the scheduler's heap, expiry, activity, renew, pause, resume."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dispatcher.core import ToolDispatcher, UnknownSessionError
from dispatcher.core.events.payloads import SessionExpired, SessionExpiring, SessionPaused, SessionResumed
from dispatcher.core.sessions.clock import (
    MAX_CLOCK_SECONDS,
    ExpiryReason,
    Lifetime,
    OnExpire,
    SessionClock,
    check_ttl,
)
from dispatcher.core.sessions.deadlines import DeadlineScheduler
from dispatcher.core.sessions.registry import BaseSessionListener, Restoration
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.core.sessions.state import Call, SessionState
from dispatcher.sandbox.fake import FakeSandboxProvider


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Provider(FakeSandboxProvider):
    def __init__(self) -> None:
        super().__init__()
        self.busy: set[str] = set()
        self.log: list[str] = []

    async def working(self, session_id: str) -> bool:
        return session_id in self.busy

    async def pause(self, session_id: str) -> None:
        self.log.append(f"pause:{session_id}")

    async def resume(self, session_id: str, *, notice: str | None = None) -> None:
        self.log.append(f"resume:{session_id}:{bool(notice)}")


def _setup(tmp: Path, **kw: object) -> tuple[ToolDispatcher, Provider, Clock]:
    provider = Provider()
    dispatcher = ToolDispatcher(provider)
    clock = Clock()
    dispatcher.lifecycle.clock = clock
    dispatcher.lifecycle._scheduler._clock = clock
    dispatcher.lifecycle.warn_before = float(kw.get("warn", 10.0))  # type: ignore[arg-type]
    return dispatcher, provider, clock


def _open(d: ToolDispatcher, sid: str, tmp: Path, life: Lifetime) -> SessionState:
    return d.sessions.open(Session(session_id=sid, workspace_path=str(tmp)), lifetime=life)


async def _tick(d: ToolDispatcher, clock: Clock) -> None:
    await d.lifecycle.handle_due(d.lifecycle._scheduler.due(clock.now))


def _types(state: SessionState) -> list[str]:
    return [e.type for e in state.bus._history]


def test_scheduler_pops_due_keys_in_order_and_skips_replaced_ones() -> None:
    s: DeadlineScheduler[str] = DeadlineScheduler(lambda: 0.0)
    s.set("a", 5)
    s.set("b", 3)
    s.set("a", 10)  # replaces 5
    s.set("c", 4)
    s.cancel("c")
    assert s.next_deadline() == 3 and len(s) == 2
    assert s.due(9) == ["b"]
    assert s.due(10) == ["a"] and s.due(1e9) == [] and len(s) == 0


def test_scheduler_handles_a_thousand_deadlines_in_one_pass() -> None:
    s: DeadlineScheduler[int] = DeadlineScheduler(lambda: 0.0)
    for i in range(1000):
        s.set(i, float(1000 - i))
    started = time.perf_counter()
    assert s.due(1000.0) == list(range(999, -1, -1))
    assert time.perf_counter() - started < 0.5


def test_ttl_check_names_the_maximum() -> None:
    check_ttl(60, 3600)
    check_ttl(0, None)
    with pytest.raises(ValueError, match="maximum of 3600 s"):
        check_ttl(7200, 3600)
    with pytest.raises(ValueError, match="maximum of 3600 s"):
        check_ttl(0, 3600)
    with pytest.raises(ValueError, match="positive"):
        check_ttl(-1, None)


async def test_idle_session_warns_once_then_expires_and_says_when(tmp_path: Path) -> None:
    d, _, clock = _setup(tmp_path)
    state = _open(d, "s1", tmp_path, Lifetime(idle_timeout_seconds=60))
    assert d.lifecycle.scheduled("s1") == clock.now + 50  # the warning first
    clock.now += 50
    await _tick(d, clock)
    warn = state.bus._history[-1].payload
    assert isinstance(warn, SessionExpiring) and warn.reason == "idle" and warn.seconds_left == 10
    clock.now += 10
    await _tick(d, clock)
    assert _types(state) == ["session.expiring", "session.expired"]
    assert d.sessions.status("s1") is SessionStatus.EXPIRED
    with pytest.raises(UnknownSessionError, match=r"expired at .*Z \(idle\)"):
        d.sessions.get("s1")


async def test_activity_moves_the_idle_deadline_without_heap_work(tmp_path: Path) -> None:
    d, _, clock = _setup(tmp_path, warn=0)
    state = _open(d, "s1", tmp_path, Lifetime(idle_timeout_seconds=60))
    clock.now += 59
    d.lifecycle.touch(state)
    clock.now += 1
    await _tick(d, clock)  # the old deadline fires, finds it used, and sets the next one
    assert d.sessions.is_open("s1") and d.lifecycle.scheduled("s1") == clock.now + 59


async def test_calls_in_flight_and_running_processes_keep_it_a_watcher_does_not(tmp_path: Path) -> None:
    d, provider, clock = _setup(tmp_path, warn=0)
    state = _open(d, "s1", tmp_path, Lifetime(idle_timeout_seconds=60))
    call = Call("tu")
    state.calls.add(call)
    clock.now += 60
    await _tick(d, clock)
    assert d.sessions.is_open("s1")
    state.calls.discard(call)
    provider.busy.add("s1")  # a background job in the sandbox
    clock.now += 60
    await _tick(d, clock)
    assert d.sessions.is_open("s1")
    provider.busy.clear()
    async with state.bus.subscribe():  # watching is not activity
        clock.now += 60
        await _tick(d, clock)
    assert d.sessions.status("s1") is SessionStatus.EXPIRED


async def test_ttl_expiry_cancels_running_calls_and_renew_moves_it(tmp_path: Path) -> None:
    d, _, clock = _setup(tmp_path, warn=0)
    state = _open(d, "s1", tmp_path, Lifetime(ttl_seconds=100))
    clock.now += 90
    d.lifecycle.renew(state, 100)
    assert state.clock.expire_time == clock.now + 100
    clock.now += 20
    await _tick(d, clock)  # the old deadline is gone
    assert d.sessions.is_open("s1")
    call = Call("tu")
    state.calls.add(call)
    call.done.set()
    clock.now += 80
    await _tick(d, clock)
    assert call.cancel_event.is_set()
    assert d.sessions.status("s1") is SessionStatus.EXPIRED
    assert "(ttl)" in d.sessions.why_gone("s1")


async def test_on_expire_pause_pauses_and_the_next_call_resumes(tmp_path: Path) -> None:
    d, provider, clock = _setup(tmp_path, warn=0)
    state = _open(d, "s1", tmp_path, Lifetime(ttl_seconds=100, on_expire=OnExpire.PAUSE))
    clock.now += 100
    await _tick(d, clock)
    assert (state.status, state.clock.paused) == (SessionStatus.PAUSED, ExpiryReason.TTL)
    assert provider.log == ["pause:s1"]
    assert [type(e.payload) for e in state.bus._history] == [SessionExpired, SessionPaused]
    async with d.lifecycle.hold(state):
        assert state.status is SessionStatus.OPEN
    assert provider.log == ["pause:s1", "resume:s1:True"]
    assert isinstance(state.bus._history[-1].payload, SessionResumed)
    assert state.clock.expire_time == clock.now + 100  # paused by its TTL: a fresh one at resume


async def test_pause_stops_the_idle_clock_but_not_the_ttl(tmp_path: Path) -> None:
    d, _, clock = _setup(tmp_path, warn=0)
    state = _open(d, "s1", tmp_path, Lifetime(ttl_seconds=1000, idle_timeout_seconds=10))
    assert await d.lifecycle.pause(state)
    assert not await d.lifecycle.pause(state)
    clock.now += 500
    await _tick(d, clock)
    assert state.status is SessionStatus.PAUSED and state.clock.idle_expire_time is None
    clock.now += 500
    await _tick(d, clock)
    assert d.sessions.status("s1") is SessionStatus.EXPIRED


async def test_a_restored_paused_session_stays_paused_and_an_overdue_one_expires_at_once(
    tmp_path: Path,
) -> None:
    d, _, clock = _setup(tmp_path, warn=0)
    paused = SessionClock(Lifetime(idle_timeout_seconds=10), None, clock.now - 100, ExpiryReason.REQUEST)
    overdue = SessionClock(Lifetime(ttl_seconds=10), clock.now - 1, clock.now - 11)
    for sid, c in (("p", paused), ("o", overdue)):
        d.sessions.open(
            Session(session_id=sid, workspace_path=str(tmp_path)),
            restored=Restoration(create_time=clock.now - 11, clock=c),
        )
    await _tick(d, clock)
    assert d.sessions.status("p") is SessionStatus.PAUSED
    assert d.sessions.status("o") is SessionStatus.EXPIRED


class Probe(Provider):
    """Writes down what the registry answers for a session at each step the provider is part of."""

    def __init__(self, d: Callable[[], ToolDispatcher]) -> None:
        super().__init__()
        self._d = d
        self.seen: list[str] = []

    async def working(self, session_id: str) -> bool:
        self.seen.append(_seen(self._d(), session_id))
        return await super().working(session_id)

    async def close_session(self, session_id: str) -> None:
        self.seen.append(_seen(self._d(), session_id))  # the sandbox stopping: the slow step
        await super().close_session(session_id)


class Closed(BaseSessionListener):
    def __init__(self, d: ToolDispatcher, seen: list[str]) -> None:
        self._d, self._seen = d, seen

    def session_closed(self, state: SessionState) -> None:
        self._seen.append(_seen(self._d, state.session.session_id))


def _seen(d: ToolDispatcher, sid: str) -> str:
    """'live', or the reason the session ended (what a server tells a client); never a shrug."""
    try:
        d.sessions.get(sid)
        return "live"
    except UnknownSessionError as exc:
        ended = d.sessions.ended(sid)
        assert ended is not None and ended.message(sid) == str(exc), f"{exc} (no reason kept)"
        return str(exc)


def _probed(tmp: Path) -> tuple[ToolDispatcher, Probe, Clock]:
    d: ToolDispatcher | None = None
    provider = Probe(lambda: d)  # type: ignore[arg-type,return-value]
    d = ToolDispatcher(provider)
    clock = Clock()
    d.lifecycle.clock = clock
    d.lifecycle._scheduler._clock = clock
    d.lifecycle.warn_before = 0
    d.sessions.subscribe(Closed(d, provider.seen))
    return d, provider, clock


@pytest.mark.parametrize("given_back", [False, True], ids=["new", "restored"])
async def test_every_step_of_an_expiry_sees_the_session_or_that_it_expired(
    tmp_path: Path, given_back: bool
) -> None:
    d, probe, clock = _probed(tmp_path)
    session = Session(session_id="s1", workspace_path=str(tmp_path))
    life = Lifetime(idle_timeout_seconds=60)
    if given_back:  # a restart gives it back: the same step ends it
        stored = SessionClock(life, None, clock.now - 30)
        d.sessions.open(session, restored=Restoration(create_time=clock.now - 30, clock=stored))
        clock.now += 30
    else:
        d.sessions.open(session, lifetime=life)
        clock.now += 60
    probe.seen.append(_seen(d, "s1"))
    await _tick(d, clock)
    probe.seen.append(_seen(d, "s1"))
    # Asked whether it works (live), its sandbox stopping, its listeners told, and after.
    assert len(probe.seen) == 5 and probe.seen[:2] == ["live", "live"]
    for answer in probe.seen[2:]:
        assert re.fullmatch(r"session 's1' expired at .*Z \(idle\)", answer), probe.seen


async def test_every_step_of_a_close_sees_the_session_or_that_it_was_closed(tmp_path: Path) -> None:
    d, probe, _ = _probed(tmp_path)
    d.sessions.open(Session(session_id="s1", workspace_path=str(tmp_path)), lifetime=Lifetime())
    probe.seen.append(_seen(d, "s1"))
    await d.close_session("s1")
    probe.seen.append(_seen(d, "s1"))
    assert probe.seen == ["live"] + ["session 's1' is closed"] * 3


async def test_clocks_stored_past_the_bound_are_cut_to_it_at_restore_and_stored(tmp_path: Path) -> None:
    d, _, clock = _setup(tmp_path, warn=0)
    stored: list[str] = []
    d.lifecycle.on_change = lambda state: stored.append(state.session.session_id)
    huge = SessionClock(Lifetime(1e13, float("inf")), clock.now + 1e13, clock.now + 9e18)
    state = d.sessions.open(
        Session(session_id="s1", workspace_path=str(tmp_path)),
        restored=Restoration(create_time=clock.now - 10, clock=huge),
    )
    assert state.clock.lifetime.ttl_seconds == state.clock.lifetime.idle_timeout_seconds == MAX_CLOCK_SECONDS
    assert state.clock.expire_time == clock.now + MAX_CLOCK_SECONDS
    assert state.clock.last_activity == clock.now
    assert state.clock.idle_expire_time == clock.now + MAX_CLOCK_SECONDS
    assert stored == ["s1"]
    sane = SessionClock(Lifetime(100, 10), clock.now + 50, clock.now - 1)
    assert not sane.bound(clock.now) and sane.expire_time == clock.now + 50
    far = SessionClock(Lifetime(100), clock.now + 50, clock.now, end_time=clock.now + 1e13)
    assert far.bound(clock.now) and far.end_time == clock.now + MAX_CLOCK_SECONDS


async def test_the_maximum_life_closes_a_session_that_pauses_at_each_expiry(tmp_path: Path) -> None:
    d, _, clock = _setup(tmp_path, warn=0)
    born = clock.now
    life = Lifetime(ttl_seconds=10, on_expire=OnExpire.PAUSE, max_life_seconds=25)
    state = _open(d, "s1", tmp_path, life)
    assert state.clock.end_time == born + 25
    clock.now += 10
    await _tick(d, clock)
    assert state.clock.paused is ExpiryReason.TTL  # before the end: it pauses as asked
    clock.now += 10
    async with d.lifecycle.hold(state):  # resumed with a fresh TTL, cut at the end of its life
        assert state.clock.expire_time == born + 25
    d.lifecycle.renew(state, 100)
    assert state.clock.expire_time == born + 25
    clock.now = born + 25
    await _tick(d, clock)
    assert d.sessions.status("s1") is SessionStatus.EXPIRED and "(ttl)" in d.sessions.why_gone("s1")


async def test_a_session_paused_at_its_ttl_still_closes_at_the_end_of_its_life(tmp_path: Path) -> None:
    d, _, clock = _setup(tmp_path, warn=0)
    born = clock.now
    state = _open(d, "s1", tmp_path, Lifetime(10, on_expire=OnExpire.PAUSE, max_life_seconds=30))
    clock.now += 10
    await _tick(d, clock)
    assert state.status is SessionStatus.PAUSED and state.clock.expire_time is None
    assert d.lifecycle.scheduled("s1") == born + 30
    clock.now = born + 30
    await _tick(d, clock)
    assert d.sessions.status("s1") is SessionStatus.EXPIRED


def test_the_end_of_life_is_stored_and_restored_under_the_tenant_maximum_now() -> None:
    clock = SessionClock.start(Lifetime(100, 0, OnExpire.PAUSE, 300), 1000.0)
    again = SessionClock.from_json(clock.to_json())
    assert (again.lifetime, again.end_time, again.expire_time) == (clock.lifetime, 1300.0, 1100.0)
    again.limit_life(150, created=1000.0)  # the tenant's maximum was lowered since
    assert (again.end_time, again.expire_time, again.lifetime.max_life_seconds) == (1150.0, 1100.0, 150)
    older = SessionClock(Lifetime(5000), expire_time=6000.0, last_activity=1000.0)  # stored without an end
    older.limit_life(300, created=1000.0)
    assert (older.end_time, older.expire_time) == (6000.0, 6000.0)  # not cut short of what it was given
    older.limit_life(0, created=1000.0)
    assert older.end_time is None
