"""Which ports of which sessions are open to the gateway, and the token each needs.

A token is 32 random bytes (URL-safe base64), handed to the client once: only its SHA-256 is kept,
and a presented one is hashed and compared in constant time (``hmac.compare_digest``). Opening an
open port again replaces its token and expiry (the old token stops working). Closing a port, its
expiry and its session's end cut every connection through it (``OpenPort.cut``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dispatcher.core.sessions.registry import BaseSessionListener
from dispatcher.core.sessions.state import SessionState

__all__ = ["HOST_LABEL", "OpenPort", "OpenPorts"]

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


class OpenPorts(BaseSessionListener):
    """The open ports of every session, by (session id, port); told of each session's end."""

    def session_closed(self, state: SessionState) -> None:
        self.close_session(state.session.session_id)

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._ports: dict[tuple[str, int], OpenPort] = {}

    def open(
        self, tenant_id: str, session_id: str, port: int, *, expires_in: float, public: bool
    ) -> tuple[OpenPort, str]:
        """Open (or reopen) a port; returns it and its token ("" when public)."""
        self.close(session_id, port)
        token = "" if public else secrets.token_urlsafe(32)
        entry = OpenPort(
            tenant_id,
            session_id,
            port,
            public,
            self._clock() + expires_in if expires_in > 0 else None,
            hashlib.sha256(token.encode()).digest() if token else b"",
        )
        self._ports[(session_id, port)] = entry
        return entry, token

    def find(self, session_id: str, port: int) -> tuple[OpenPort | None, bool]:
        """The open port, and whether it had expired (then it is closed now, and None given)."""
        entry = self._ports.get((session_id, port))
        if entry is None:
            return None, False
        if entry.expires is not None and self._clock() >= entry.expires:
            self.close(session_id, port)
            return None, True
        return entry, False

    def close(self, session_id: str, port: int) -> OpenPort | None:
        """Close a port (cutting its connections); the entry it was, if open."""
        entry = self._ports.pop((session_id, port), None)
        if entry is not None:
            entry.cut.set()
        return entry

    def close_session(self, session_id: str) -> None:
        """The session ended: every port of it closes."""
        for sid, port in [key for key in self._ports if key[0] == session_id]:
            self.close(sid, port)

    def of_session(self, session_id: str) -> list[OpenPort]:
        """The session's open ports (expired ones closed first), by port."""
        for sid, port in [key for key in self._ports if key[0] == session_id]:
            self.find(sid, port)
        return sorted((e for (sid, _), e in self._ports.items() if sid == session_id), key=lambda e: e.port)
