"""What a restart gives back before the server serves: the sessions the previous run stored, then
the preview ports open on them, or, on a server without a preview gateway, those ports dropped from
``state.db`` (Walk 3 of ``docs/architecture.md``)."""

from __future__ import annotations

import logging
from collections.abc import Collection

from dispatcher.core.sessions.registry import SessionRegistry
from dispatcher.server.persistence.state import Persistence
from dispatcher.server.preview.opening import Previews
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import TenantDirectory

log = logging.getLogger("dispatcher.server")


def restore_sessions(
    persistence: Persistence,
    sessions: SessionManager,
    tenants: TenantDirectory,
    registry: SessionRegistry,
    previews: Previews | None,
    allow_public: Collection[str],
) -> None:
    """Give back the sessions stored by the previous run (the provider, a listener, expects
    their containers), then their preview ports (``registry``: the sessions' one owner)."""
    persistence.restore(sessions, tenants)
    if sessions.count():
        log.info("stored sessions given back", extra={"sessions": sessions.count()})
    if previews is not None:
        previews.ports.restore(lambda session_id: _tenant_of_session(registry, session_id), allow_public)
        return
    stored = persistence.stored_ports()
    if stored:
        log.warning(
            "stored preview ports dropped: this server has no preview gateway",
            extra={"ports": len(stored)},
        )
        persistence.ports_dropped((p.session_id, p.port) for p in stored)


def _tenant_of_session(registry: SessionRegistry, session_id: str) -> str | None:
    """The tenant of an open (or paused) session; None when there is no such session."""
    state = registry.find(session_id)
    return state.session.tenant_id if state is not None and state.status.alive else None
