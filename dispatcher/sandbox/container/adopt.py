"""Giving a restarted server its sessions' containers back instead of reaping them.

A container is adopted only when everything agrees: it carries this instance's label and the
session's and tenant's labels, its id is the one the session's stored state names, and it still
runs (each host checks its own listing: ``docker/orphans.py``, ``kubernetes/pods.py``). A fresh
agent is then started in it (or, on a Pod, attached again), so only the server ever talks to it.
Anything else is removed, and the session's next call gets a fresh sandbox whose result says why.
"""

from __future__ import annotations

import contextlib
import logging

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.host import ContainerHost, LiveContainer

log = logging.getLogger(__name__)

GONE = "its container was gone when the server restarted"


async def reattach(host: ContainerHost, session: Session, container_id: str) -> LiveContainer | str:
    """Start a new agent in the session's running container; a string says why that failed (the
    container is then removed)."""
    try:
        link = await host.start_agent(container_id, session)
    except (SandboxError, ConnectionError, OSError) as exc:
        log.warning(
            "session %s: re-attaching container %s failed: %s", session.session_id, container_id[:12], exc
        )
        with contextlib.suppress(Exception):
            await host.remove_container(container_id)
        return f"its agent could not be re-attached after the server restarted ({exc})"
    log.info("session %s: re-adopted container %s", session.session_id, container_id[:12])
    if link is None:
        return LiveContainer(container_id, None, None, started=host.clock())
    return LiveContainer(container_id, link[0], link[1], started=host.clock())
