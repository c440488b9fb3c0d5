"""Giving a restarted server its sessions' containers back instead of reaping them.

A container is adopted only when everything agrees: it carries this instance's label and the
session's and tenant's labels, its id is the one the session's stored state names, and it still
runs. A fresh agent is then started in it through ``docker exec`` (the previous server's agent
exited when its attach stream closed, leaving the processes that commands started in the
background), so only the server, through the Docker API, ever talks to it. Anything else is
removed, and the session's next call gets a fresh sandbox whose result says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.docker.config import (
    LABEL_INSTANCE,
    LABEL_POOL,
    LABEL_SESSION,
    LABEL_TENANT,
    SandboxConfig,
)
from dispatcher.sandbox.docker.host import ContainerHost, LiveContainer

log = logging.getLogger(__name__)

GONE = "its container was gone when the server restarted"
LABEL_SPEC = "dispatcher.spec"
"""Fingerprint of what the container was made from (``spec_fingerprint``)."""


def spec_fingerprint(config: SandboxConfig, session: Session) -> str:
    """What a session's container was made from: the sandbox config, the user it runs as, its
    workspace and its grants. A container made from anything else is not re-adopted (its mounts,
    user or limits would no longer be the configured ones)."""
    caps = session.capabilities
    grants = None
    if caps is not None and caps.fs_grants is not None:
        grants = [(g.prefix, g.mode) for g in caps.fs_grants]
    what = (
        repr(config),
        session.sandbox_uid,
        session.sandbox_gid,
        session.workspace_root,
        session.workspace_name,
        session.workspace_path,
        repr(grants),
    )
    return hashlib.sha256(repr(what).encode()).hexdigest()[:32]


def pool_fingerprint(config: SandboxConfig, user: str) -> str:
    """What a warm pool's container was made from: the sandbox config and the user it runs as
    (its session's workspace came later, through its slot, and is confirmed again at re-adoption)."""
    return hashlib.sha256(repr(("warm-pool", repr(config), user)).encode()).hexdigest()[:32]


def adoption_problem(
    container: Mapping[str, Any], session: Session, instance: str, config: SandboxConfig
) -> str | None:
    """Why a listed container (``containers(all=True)`` form) cannot be the session's; None: it can."""
    labels = container.get("Labels") or {}
    expected = {LABEL_INSTANCE: instance, LABEL_SESSION: session.session_id, LABEL_TENANT: session.tenant_id}
    if any(labels.get(k) != v for k, v in expected.items()):
        return "its container's labels no longer matched the session after the server restarted"
    if labels.get(LABEL_POOL):
        made_for = pool_fingerprint(config, config.user_for(session.sandbox_uid, session.sandbox_gid))
        caps = session.capabilities
        if labels.get(LABEL_SPEC) != made_for or (caps is not None and caps.fs_grants is not None):
            return "the sandbox configuration (image, limits or user) changed across the restart"
    elif labels.get(LABEL_SPEC) != spec_fingerprint(config, session):
        return (
            "the sandbox configuration (image, limits, user, workspace or grants) changed across the restart"
        )
    if container.get("State") not in ("running", "paused"):  # paused: its session was
        return f"its container had stopped ({container.get('State')}) when the server restarted"
    lifetime = config.max_lifetime_seconds
    if lifetime is not None and time.time() - float(container.get("Created") or 0) >= lifetime:
        return f"its container had reached the sandbox's maximum lifetime ({lifetime:g} s)"
    return None


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
