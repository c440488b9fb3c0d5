"""How the core's Session for a tenant's workspace is made (new, or given back after a restart):
below both the session manager and the persistence that restores."""

from __future__ import annotations

import os
from collections.abc import Mapping

from dispatcher.core.capabilities import Capabilities
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import Role
from dispatcher.server.tenancy.tenants import Tenant

__all__ = ["build_session"]


def build_session(
    tenant: Tenant,
    session_id: str,
    name: str,
    path: str,
    role: Role,
    labels: Mapping[str, str],
    *,
    approval_mode: str = "cautious",
    capabilities: Capabilities | None = None,
) -> Session:
    """The core's Session for a workspace of the tenant (new, or given back after a restart).

    ``capabilities`` (the session's own, as stored) are intersected with the tenant's as they
    are now: a session given back never holds more than its tenant."""
    return Session(
        session_id=session_id,
        workspace_path=path,
        tenant_id=tenant.tenant_id,
        role=role,
        labels=dict(labels),
        policy=tenant.policy,
        capabilities=tenant.capabilities.intersect(capabilities),
        approval_mode=approval_mode,
        workspace_root=os.path.realpath(tenant.workspace_root),
        workspace_name=name,
        sandbox_uid=tenant.uid,
        sandbox_gid=tenant.gid,
    )
