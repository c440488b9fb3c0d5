"""The labels every session container (or Pod) carries, and the fingerprints that say what it was
made from: how a restarted server tells its own containers, their sessions and tenants, and whether
one may be re-adopted, on either host."""

from __future__ import annotations

import hashlib

from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig

LABEL_SESSION = "dispatcher.session"
LABEL_TENANT = "dispatcher.tenant"
LABEL_INSTANCE = "dispatcher.instance"
LABEL_POOL = "dispatcher.pool"
"""On a warm pool's containers (no session label): a restarted server removes them as orphans."""
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
