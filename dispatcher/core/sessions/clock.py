"""A session's two clocks: an absolute lifetime (TTL) and a limit on time without activity (idle).

``Lifetime`` is what was asked for at creation (the config's defaults, a request's own values within
its tenant's maximum); ``SessionClock`` is where the session stands now: its absolute expiry (moved
by a renew), its last activity, whether it is paused and why. The clock is part of the session's
stored state (``to_json``/``from_json``), so a restarted server honours it. Times are wall-clock
epoch seconds: they must mean the same after a restart.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = ["MAX_CLOCK_SECONDS", "ExpiryReason", "Lifetime", "OnExpire", "SessionClock"]

MAX_CLOCK_SECONDS = 10 * 365 * 86_400
"""The longest TTL or idle timeout any session may have (10 years, 315,360,000 s), whatever its
tenant: far inside what a protobuf Timestamp (up to year 9999) and a float of epoch seconds hold,
so no deadline a request sets can fail to convert once stored."""


class ExpiryReason(StrEnum):
    """Why a session expired, was paused or resumed."""

    TTL = "ttl"
    IDLE = "idle"
    REQUEST = "request"


class OnExpire(StrEnum):
    """What happens when a clock runs out."""

    CLOSE = "close"
    PAUSE = "pause"


@dataclass(frozen=True, slots=True)
class Lifetime:
    """The clocks a session runs under; 0 turns a clock off."""

    ttl_seconds: float = 0.0
    idle_timeout_seconds: float = 0.0
    on_expire: OnExpire = OnExpire.CLOSE
    max_life_seconds: float = 0.0
    """The longest the session may live from its start, renewals, pauses and resumes included
    (its tenant's ``max_session_ttl_seconds``); past it the session closes, whatever ``on_expire``
    says. 0: no maximum."""


def check_ttl(ttl_seconds: float, maximum: float | None, *, what: str = "ttl_seconds") -> None:
    """A TTL a tenant may ask for: not negative, at most ``MAX_CLOCK_SECONDS``, not above ``maximum``
    (None or 0: no maximum; with one, 0 ("none") is above it too).

    Raises:
        ValueError: naming the field and the bound.
    """
    check_clock(ttl_seconds, what=what)
    if maximum and (ttl_seconds == 0 or ttl_seconds > maximum):
        asked = "none (0)" if ttl_seconds == 0 else f"{ttl_seconds:g} s"
        raise ValueError(
            f"{what}: {asked} is above the tenant's maximum of {maximum:g} s (max_session_ttl_seconds)"
        )


def check_clock(seconds: float, *, what: str) -> None:
    """A clock's length (a TTL, an idle timeout): 0 (none) or positive, at most ``MAX_CLOCK_SECONDS``.

    Raises:
        ValueError: naming the field and the bound.
    """
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_CLOCK_SECONDS:
        raise ValueError(
            f"{what}: must be 0 (none) or a positive number of seconds up to {MAX_CLOCK_SECONDS:,}"
            f" (10 years), got {seconds:g}"
        )


@dataclass(slots=True)
class SessionClock:
    """Where a session stands against its clocks (changed only by ``core/sessions/expiry.py``)."""

    lifetime: Lifetime = field(default_factory=Lifetime)
    expire_time: float | None = None
    """Absolute expiry (epoch s); None: no TTL (or paused by it, until resumed)."""
    last_activity: float = 0.0
    """The last RPC, call or running process seen (epoch s)."""
    paused: ExpiryReason | None = None
    """Why the session is paused; None while it runs."""
    warned: set[str] = field(default_factory=set)
    """Which coming expiries (``ttl``, ``idle``) were announced (``session.expiring``), once each."""
    end_time: float | None = None
    """The latest the session may live (epoch s): its start plus ``lifetime.max_life_seconds``; no
    expiry is ever set past it. None: no maximum."""

    @classmethod
    def start(cls, lifetime: Lifetime | None, now: float) -> SessionClock:
        """The clock of a session created at ``now``."""
        life = lifetime or Lifetime()
        end = now + life.max_life_seconds if life.max_life_seconds > 0 else None
        clock = cls(life, None, now, end_time=end)
        clock.renew(life.ttl_seconds, now)
        return clock

    def past_end(self, now: float) -> bool:
        """The session has lived as long as its maximum allows: it closes, it does not pause."""
        return self.end_time is not None and now >= self.end_time

    @property
    def idle_expire_time(self) -> float | None:
        """When the session expires if nothing happens until then; None: no idle clock, or paused."""
        idle = self.lifetime.idle_timeout_seconds
        if idle <= 0 or self.paused is not None:
            return None
        return self.last_activity + idle

    def renew(self, ttl_seconds: float, now: float) -> None:
        """A new absolute expiry ``ttl_seconds`` from now (0: none), never past ``end_time``."""
        expire = now + ttl_seconds if ttl_seconds > 0 else None
        if self.end_time is not None:
            expire = self.end_time if expire is None else min(expire, self.end_time)
        self.expire_time = expire
        self.warned.discard(ExpiryReason.TTL.value)

    def limit_life(self, max_life_seconds: float, created: float) -> None:
        """Put a restored session under its tenant's maximum as configured now (0: none), counted
        from ``created``. A session stored without an end (by an older server, or while its tenant
        had no maximum) keeps the expiry it was given, if that is later."""
        end = created + max_life_seconds if max_life_seconds > 0 else None
        if end is not None and self.end_time is None and self.expire_time is not None:
            end = max(end, self.expire_time)
        self.lifetime = dataclasses.replace(self.lifetime, max_life_seconds=max_life_seconds)
        self.end_time = end
        if end is not None and self.expire_time is not None:
            self.expire_time = min(self.expire_time, end)

    def bound(self, now: float) -> bool:
        """Bring clocks an older server stored without bounds within ``MAX_CLOCK_SECONDS`` (a TTL or
        idle timeout at most that long, an expiry at most that far from ``now``), so that no stored
        session fails to convert (a protobuf Timestamp ends at year 9999); True if any changed."""
        life = self.lifetime
        ttl = _at_most(life.ttl_seconds, MAX_CLOCK_SECONDS)
        idle = _at_most(life.idle_timeout_seconds, MAX_CLOCK_SECONDS)
        latest = now + MAX_CLOCK_SECONDS
        expire = None if self.expire_time is None else _at_most(self.expire_time, latest)
        end = None if self.end_time is None else _at_most(self.end_time, latest)
        last = _at_most(self.last_activity, now)
        before = (
            life.ttl_seconds,
            life.idle_timeout_seconds,
            self.expire_time,
            self.end_time,
            self.last_activity,
        )
        changed = (ttl, idle, expire, end, last) != before
        if changed:
            self.lifetime = dataclasses.replace(life, ttl_seconds=ttl, idle_timeout_seconds=idle)
            self.expire_time, self.end_time, self.last_activity = expire, end, last
        return changed

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        life = self.lifetime
        return {
            "ttl_seconds": life.ttl_seconds,
            "idle_timeout_seconds": life.idle_timeout_seconds,
            "on_expire": life.on_expire.value,
            "max_life_seconds": life.max_life_seconds,
            "expire_time": self.expire_time,
            "end_time": self.end_time,
            "last_activity": self.last_activity,
            "paused": self.paused.value if self.paused is not None else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionClock:
        """The clock as stored.

        Raises:
            ValueError: a damaged value.
        """
        try:
            life = Lifetime(
                float(data.get("ttl_seconds") or 0.0),
                float(data.get("idle_timeout_seconds") or 0.0),
                OnExpire(data.get("on_expire") or OnExpire.CLOSE.value),
                float(data.get("max_life_seconds") or 0.0),
            )
            expire = data.get("expire_time")
            end = data.get("end_time")
            paused = data.get("paused")
            return cls(
                life,
                float(expire) if expire is not None else None,
                float(data.get("last_activity") or 0.0),
                ExpiryReason(paused) if paused else None,
                end_time=float(end) if end is not None else None,
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(f"lifecycle: {exc}") from None


def _at_most(value: float, bound: float) -> float:
    """``value``, or ``bound`` when it is larger or not a number at all."""
    return value if math.isfinite(value) and value <= bound else bound
