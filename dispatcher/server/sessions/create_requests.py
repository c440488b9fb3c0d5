"""Retry-safe CreateSession: a tenant's request ids of the last 10 minutes and what each created.

A client that lost the reply to a CreateSession sends it again with the same ``request_id``: it
gets the session the first one made, not a second session. The same id with a different request
is a client bug, refused (``ALREADY_EXISTS``) rather than guessed at.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher.server.requests.errors import AlreadyExists

__all__ = ["REQUEST_ID_TTL", "CreateRequests"]

REQUEST_ID_TTL = 600.0
"""How long a request id is remembered (seconds)."""
MAX_REMEMBERED = 10_000
"""Request ids remembered at most per tenant (its oldest forgotten first): one tenant's flood of
creates cannot push another tenant's ids out."""


@dataclass(frozen=True, slots=True)
class _Seen:
    fingerprint: str
    session_id: str
    at: float


class CreateRequests:
    """Request id -> the session it created, per tenant, for ``REQUEST_ID_TTL`` seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen: dict[str, OrderedDict[str, _Seen]] = {}

    def find(self, tenant_id: str, request_id: str, fingerprint: str) -> str | None:
        """The session this request created already; None: a new request (or no id).

        Raises:
            AlreadyExists: the id was used for a different request.
        """
        if not request_id:
            return None
        seen = self._of(tenant_id).get(request_id)
        if seen is None:
            return None
        if seen.fingerprint != fingerprint:
            raise AlreadyExists(
                f"request_id {request_id!r} was used for a different CreateSession request"
                f" (session {seen.session_id!r}); use a new id for a new request"
            )
        return seen.session_id

    def remember(self, tenant_id: str, request_id: str, fingerprint: str, session_id: str) -> None:
        if request_id:
            seen = self._of(tenant_id)
            seen[request_id] = _Seen(fingerprint, session_id, self._clock())
            while len(seen) > MAX_REMEMBERED:
                seen.popitem(last=False)

    def _of(self, tenant_id: str) -> OrderedDict[str, _Seen]:
        """The tenant's ids of the last ``REQUEST_ID_TTL`` seconds, oldest first."""
        seen = self._seen.setdefault(tenant_id, OrderedDict())
        horizon = self._clock() - REQUEST_ID_TTL
        while seen:
            oldest = next(iter(seen.values()))
            if oldest.at >= horizon:
                break
            seen.popitem(last=False)
        return seen
