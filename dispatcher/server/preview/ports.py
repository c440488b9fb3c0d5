"""Which ports of which sessions are open to the gateway, and the token each needs.

A token is 32 random bytes (URL-safe base64), handed to the client once: only its SHA-256 is kept,
and a presented one is hashed and compared in constant time (``hmac.compare_digest``). Opening an
open port again replaces its token and expiry (the old token stops working). Closing a port, its
expiry and its session's end cut every connection through it (``OpenPort.cut``).

Open ports survive a restart: each is kept in ``state.db`` by the keeper given (the session
persistence: tenant, session, port, public, expiry and the token's digest), committed before
``open`` and ``revoke`` return, and ``restore`` gives back at start those whose session was given
back and whose expiry has not passed, so the same URL and token work again. Expiry is a wall-clock
time, so a port given back expires when it would have. A session has at most
``MAX_PORTS_PER_SESSION`` open ports, at start too.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from dispatcher.core.sessions.registry import BaseSessionListener
from dispatcher.core.sessions.state import SessionState
from dispatcher.server.persistence.state import IN_MEMORY
from dispatcher.server.persistence.store import StoredPort
from dispatcher.server.requests.errors import QuotaExceeded

__all__ = [
    "HOST_LABEL",
    "MAX_EXPIRES_SECONDS",
    "MAX_PORTS_PER_SESSION",
    "OpenPort",
    "OpenPorts",
    "PortKeeper",
]

log = logging.getLogger("dispatcher.server.preview.ports")

MAX_PORTS_PER_SESSION = 64
"""Ports one session may have open at once (each is a row in ``state.db`` and an entry here)."""
MAX_EXPIRES_SECONDS = 30 * 86400
"""The longest expiry OpenPort gives."""

HOST_LABEL = re.compile(r"([1-9][0-9]{0,4})-([A-Za-z0-9_]{1,64})")
"""The first label of a preview host name: ``{port}-{session_id}``."""


@dataclass(eq=False)
class OpenPort:
    """One open port."""

    tenant_id: str
    session_id: str
    port: int
    public: bool
    expires: float | None  # wall-clock seconds; None: until closed
    digest: bytes  # SHA-256 of the token (empty when public)
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the port closes or expires: every connection through it ends."""

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is this port's (constant time in the token's content)."""
        given = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        return hmac.compare_digest(given, self.digest)


class PortKeeper(Protocol):
    """Where open ports are kept to survive a restart (the session persistence)."""

    def port_changed(self, session_id: str, port: int, row: StoredPort | None) -> Future[None]:
        """Keep a port opened (``row``) or closed (None); done once committed."""
        ...

    def stored_ports(self) -> list[StoredPort]:
        """The ports kept by the previous run."""
        ...

    def ports_dropped(self, keys: Iterable[tuple[str, int]]) -> None:
        """Forget kept ports that are not given back."""
        ...


class OpenPorts(BaseSessionListener):
    """The open ports of every session, by (session id, port); told of each session's end."""

    def session_closed(self, state: SessionState) -> None:
        self.close_session(state.session.session_id)

    def __init__(self, clock: Callable[[], float] = time.time, keeper: PortKeeper = IN_MEMORY) -> None:
        self._clock = clock
        self._keeper = keeper
        self._ports: dict[str, dict[int, OpenPort]] = {}  # session id -> port -> entry
        self._timers: dict[tuple[str, int], asyncio.TimerHandle] = {}

    async def open(
        self, tenant_id: str, session_id: str, port: int, *, expires_in: float, public: bool
    ) -> tuple[OpenPort, str]:
        """Open (or reopen) a port; returns it and its token ("" when public), once it is kept.

        Raises:
            QuotaExceeded: the session has ``MAX_PORTS_PER_SESSION`` other ports open.
        """
        others = [e for e in self.of_session(session_id) if e.port != port]
        if len(others) >= MAX_PORTS_PER_SESSION:
            raise QuotaExceeded(
                f"session {session_id} already has {MAX_PORTS_PER_SESSION} ports open: close one first"
            )
        self._drop(session_id, port)
        token = "" if public else secrets.token_urlsafe(32)
        entry = OpenPort(
            tenant_id,
            session_id,
            port,
            public,
            self._clock() + expires_in if expires_in > 0 else None,
            hashlib.sha256(token.encode()).digest() if token else b"",
        )
        self._add(entry)
        row = StoredPort(tenant_id, session_id, port, public, entry.expires, entry.digest)
        # Queued in the order of the changes here, so the file ends as memory does.
        await asyncio.wrap_future(self._keeper.port_changed(session_id, port, row))
        return entry, token

    def restore(self, session_of: Callable[[str], str | None], allow_public: Collection[str]) -> None:
        """Give back the kept ports of the sessions given back (``session_of``: a live session's
        tenant, None when it is gone), each with its token digest and expiry (its timer set for
        the time left). Dropped, their rows deleted, with a log line each: a port whose session is
        gone or of another tenant, expired, public for a tenant no longer allowed, or past
        ``MAX_PORTS_PER_SESSION``."""
        now = self._clock()
        dropped: list[tuple[str, int]] = []
        given = 0
        for row in self._keeper.stored_ports():
            mine = self._ports.get(row.session_id, {})
            problem = _stored_problem(row, session_of(row.session_id), allow_public, now)
            if problem is None and row.port in mine:
                problem = "a duplicate"
            if problem is None and len(mine) >= MAX_PORTS_PER_SESSION:
                problem = f"its session has {MAX_PORTS_PER_SESSION} ports open already"
            if problem is not None:
                log.warning(
                    "stored preview port dropped: %s",
                    problem,
                    extra={"session_id": row.session_id, "tenant_id": row.tenant_id, "port": row.port},
                )
                dropped.append((row.session_id, row.port))
                continue
            self._add(OpenPort(row.tenant_id, row.session_id, row.port, row.public, row.expires, row.digest))
            given += 1
        kept = [key for key in dropped if key[1] not in self._ports.get(key[0], {})]
        if kept:
            self._keeper.ports_dropped(kept)
        if given:
            log.info("preview ports given back", extra={"ports": given})

    def find(self, session_id: str, port: int) -> tuple[OpenPort | None, bool]:
        """The open port, and whether it had expired (then it is closed now, and None given)."""
        entry = self._ports.get(session_id, {}).get(port)
        if entry is None:
            return None, False
        if entry.expires is not None and self._clock() >= entry.expires:
            self.close(session_id, port)
            return None, True
        return entry, False

    def close(self, session_id: str, port: int) -> OpenPort | None:
        """Close a port (cutting its connections; its row is deleted in the background); the
        entry it was, if open."""
        entry = self._drop(session_id, port)
        if entry is not None:
            self._keeper.port_changed(session_id, port, None)
        return entry

    async def revoke(self, session_id: str, port: int) -> OpenPort | None:
        """Close a port, and return once its row is deleted: its token stays dead after a restart."""
        entry = self._drop(session_id, port)
        if entry is not None:
            await asyncio.wrap_future(self._keeper.port_changed(session_id, port, None))
        return entry

    def close_session(self, session_id: str) -> None:
        """The session ended: every port of it closes (its rows go with the session's)."""
        for port in list(self._ports.get(session_id, {})):
            self._drop(session_id, port)

    def of_session(self, session_id: str) -> list[OpenPort]:
        """The session's open ports (expired ones closed first), by port."""
        for port in list(self._ports.get(session_id, {})):
            self.find(session_id, port)
        return sorted(self._ports.get(session_id, {}).values(), key=lambda e: e.port)

    def _add(self, entry: OpenPort) -> None:
        self._ports.setdefault(entry.session_id, {})[entry.port] = entry
        if entry.expires is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a synchronous caller): expiry is still checked at each lookup
        # The expiry cuts the port's connections and deletes its row when it comes, not only at
        # the next request: a WebSocket open past it is cut, a restart does not find the row.
        delay = max(entry.expires - self._clock(), 0.0)
        self._timers[(entry.session_id, entry.port)] = loop.call_later(delay, self._expire, entry)

    def _expire(self, entry: OpenPort) -> None:
        """The expiry's timer. The entry stays until the next lookup, which closes it and says
        it expired (the gateway audits a request for it as such, and answers 404)."""
        self._timers.pop((entry.session_id, entry.port), None)
        if self._ports.get(entry.session_id, {}).get(entry.port) is entry:
            entry.cut.set()
            self._keeper.port_changed(entry.session_id, entry.port, None)

    def _drop(self, session_id: str, port: int) -> OpenPort | None:
        timer = self._timers.pop((session_id, port), None)
        if timer is not None:
            timer.cancel()
        mine = self._ports.get(session_id)
        entry = mine.pop(port, None) if mine is not None else None
        if mine is not None and not mine:
            del self._ports[session_id]
        if entry is not None:
            entry.cut.set()
        return entry


def _stored_problem(
    row: StoredPort, tenant: str | None, allow_public: Collection[str], now: float
) -> str | None:
    """Why a kept port may not open again; None: it may."""
    if tenant is None:
        return "its session is gone"
    if tenant != row.tenant_id:
        return f"its session belongs to tenant {tenant!r}, not {row.tenant_id!r}"
    if row.expires is not None and now >= row.expires:
        return "it expired"
    if row.expires is not None and row.expires > now + MAX_EXPIRES_SECONDS + 86400:
        return "its expiry is further away than OpenPort gives (the clock went back?)"
    if row.public and row.tenant_id not in allow_public:
        return f"tenant {row.tenant_id!r} may no longer open public previews (preview.allow_public)"
    return None
