"""OpenPort and ClosePort: who may open a sandbox port to the gateway, and what it answers.

Only a client of the session's tenant opens a port (the model has no tool for it). ``public``
only for a tenant the config lists in ``preview.allow_public``. Audited without the token. Both
answer once the change is committed to ``state.db``: a token handed out works after a restart, a
closed port stays closed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dispatcher.config.sections import PreviewSection
from dispatcher.core.errors import UnknownSessionError
from dispatcher.core.sandbox_api import check_port
from dispatcher.server.preview.ports import MAX_EXPIRES_SECONDS, OpenPorts
from dispatcher.server.requests.errors import FailedPrecondition, InvalidRequest
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import Tenant

__all__ = ["AUDIT_CLOSE", "AUDIT_OPEN", "MAX_EXPIRES_SECONDS", "Opened", "Previews"]

AUDIT_OPEN = "preview.open"
AUDIT_CLOSE = "preview.close"


@dataclass(frozen=True, slots=True)
class Opened:
    url: str
    token: str
    expire_time: float | None


@dataclass
class Previews:
    """The gateway's open ports and how its URLs are made; ``listen_port``: 0 until it listens."""

    ports: OpenPorts
    config: PreviewSection
    listen_port: int = 0

    def url(self, session_id: str, port: int) -> str:
        host = f"{port}-{session_id}.{self.config.domain}"
        if self.config.public_url is not None:
            scheme, _, rest = self.config.public_url.partition("://")
            return f"{scheme}://{port}-{session_id}.{rest.rstrip('/')}/"
        return f"http://{host}:{self.listen_port}/"


async def open_port(
    sessions: SessionManager,
    previews: Previews | None,
    tenant: Tenant,
    session_id: str,
    port: int,
    expires_in_seconds: int,
    public: bool,
) -> Opened:
    """OpenPort.

    Raises:
        UnknownSessionError, InvalidRequest (port, expiry), FailedPrecondition (no gateway, public
        not allowed), QuotaExceeded (the session's ``MAX_PORTS_PER_SESSION``).
    """
    sessions.get(tenant, session_id)
    if previews is None:
        raise FailedPrecondition("this server has no preview gateway: set preview.listen in its config")
    check_port(port)
    if not (math.isfinite(expires_in_seconds) and 0 <= expires_in_seconds <= MAX_EXPIRES_SECONDS):
        raise InvalidRequest(f"expires_in_seconds: from 0 (never) to {MAX_EXPIRES_SECONDS}")
    if public and tenant.tenant_id not in previews.config.allow_public:
        raise FailedPrecondition(
            f"tenant {tenant.tenant_id!r} may not open public previews (preview.allow_public)"
        )
    entry, token = await previews.ports.open(
        tenant.tenant_id, session_id, port, expires_in=float(expires_in_seconds), public=public
    )
    sessions.dispatcher.audit_record(
        AUDIT_OPEN,
        tenant=tenant.tenant_id,
        session=session_id,
        port=port,
        public=public,
        expires_in_seconds=expires_in_seconds,
    )
    return Opened(previews.url(session_id, port), token, entry.expires)


async def close_port(
    sessions: SessionManager, previews: Previews | None, tenant: Tenant, session_id: str, port: int
) -> None:
    """ClosePort: the token stops working, every connection through the port is cut.

    Raises:
        UnknownSessionError: also when the port is not open (NOT_FOUND).
    """
    sessions.get(tenant, session_id)
    check_port(port)
    if previews is None or await previews.ports.revoke(session_id, port) is None:
        raise UnknownSessionError(f"port {port} of session {session_id} is not open")
    sessions.dispatcher.audit_record(AUDIT_CLOSE, tenant=tenant.tenant_id, session=session_id, port=port)
