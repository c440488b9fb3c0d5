"""The config's tenants as the server runs them, and the checks that keep each one's own.

Each tenant's id, token hashes and uid are its alone; no workspace root holds another tenant's, the
server's home or its state. A mistake is a line in the caller's ``problems``, so that one run of
``serve`` or ``config-check`` reports every one.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher.config import TOKEN_FILE
from dispatcher.config.egress import EgressSection, egress_policy
from dispatcher.config.policy import DEFAULT_APPROVAL_MODES
from dispatcher.config.sections import Quotas, TenantSection
from dispatcher.core.approval.confirmation_policy import PolicyLayer
from dispatcher.core.approval.modes import ApprovalMode
from dispatcher.core.capabilities import Capabilities
from dispatcher.egress.policy import EgressPolicy

__all__ = ["HOME_STATE", "TenantConfig", "check_workspace_roots", "tenant_configs"]

HOME_STATE = ("run", "volumes", TOKEN_FILE, "state.db", "audit.jsonl", "uids.json", "server.lock")
"""What the server keeps in its home besides workspaces; no tenant root may hold or be inside it."""


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One tenant: who it is (token hashes), where its workspaces live and what it may do."""

    tenant_id: str
    token_sha256: tuple[str, ...]
    workspace_root: Path
    capabilities: Capabilities = field(default_factory=Capabilities)
    policy_overrides: PolicyLayer | None = None
    quotas: Quotas = field(default_factory=Quotas)
    uid: int | None = None
    """Host uid of the tenant's sandboxes; None: allocated from ``Config.tenant_uids`` (if set)."""
    gid: int | None = None
    """Host gid; None: the uid."""
    approval_modes: tuple[ApprovalMode, ...] = DEFAULT_APPROVAL_MODES
    """The approval modes its sessions may choose; the first is what a session that names none gets."""
    approval_modes_key: str = "top-level approval_modes"
    """The config key that sets ``approval_modes`` (a refusal names it)."""
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """Its ``egress:`` (laid over the top level's); ``capabilities.egress_allow`` is its ``allow``."""
    max_session_ttl_seconds: float | None = None
    """The longest TTL its sessions may have (None: no maximum)."""


def tenant_configs(
    sections: tuple[TenantSection, ...],
    home: Path,
    egress: EgressSection,
    approval_modes: tuple[ApprovalMode, ...],
    problems: list[str],
) -> tuple[TenantConfig, ...]:
    """Each tenant's own: ids, tokens and uids are never shared (else a line in ``problems``)."""
    seen_ids: set[str] = set()
    seen_hashes: set[str] = set()
    seen_uids: dict[int, str] = {}
    out: list[TenantConfig] = []
    for i, item in enumerate(sections):
        where = f"tenants[{i}]"
        if item.id in seen_ids:
            problems.append(f"{where}.id: duplicate tenant id {item.id!r}")
        seen_ids.add(item.id)
        for digest in item.token_sha256:
            if digest in seen_hashes:
                problems.append(f"{where}.token_sha256: token already belongs to another tenant")
            seen_hashes.add(digest)
        if item.uid is not None and item.uid in seen_uids:
            problems.append(
                f"{where}.uid: {item.uid} belongs to tenant {seen_uids[item.uid]!r}; tenants never share"
            )
        if item.uid is not None:
            seen_uids[item.uid] = item.id
        # A relative root is under the server's home, never under whatever directory it started in.
        root = item.workspace_root
        tenant_egress = egress_policy(item.egress.over(egress) if item.egress else egress)
        out.append(
            TenantConfig(
                tenant_id=item.id,
                token_sha256=item.token_sha256,
                workspace_root=home / Path(root).expanduser() if root else home / "workspaces" / item.id,
                capabilities=dataclasses.replace(item.capabilities(), egress_allow=tenant_egress.allow),
                policy_overrides=item.tool_confirmation.layer() if item.tool_confirmation else None,
                quotas=item.quotas,
                uid=item.uid,
                gid=item.gid if item.gid is not None else item.uid,
                approval_modes=item.approval_modes or approval_modes,
                approval_modes_key=f"{where}.approval_modes"
                + ("" if item.approval_modes else " (or the top-level approval_modes)"),
                egress=tenant_egress,
                max_session_ttl_seconds=item.max_session_ttl_seconds,
            )
        )
    return tuple(out)


def check_workspace_roots(
    tenants: tuple[TenantConfig, ...], home: Path, audit: Path, problems: list[str]
) -> None:
    """A tenant's sandboxes write under its root: no root may hold another's, or the server's state
    (else a line in ``problems`` naming the tenant's ``workspace_root``)."""
    real_home = Path(os.path.realpath(home))
    state = [real_home / name for name in HOME_STATE] + [Path(os.path.realpath(audit))]
    roots = [Path(os.path.realpath(t.workspace_root)) for t in tenants]
    for i, root in enumerate(roots):
        where = f"tenants[{i}].workspace_root"
        if real_home.is_relative_to(root):
            problems.append(
                f"{where}: {root} holds the server's home {real_home}; use a directory of its own"
            )
            continue
        overlaps = [p for p in state if p.is_relative_to(root) or root.is_relative_to(p)]
        if overlaps:
            problems.append(
                f"{where}: {root} overlaps the server's state {overlaps[0]}; use another directory"
            )
        for j, other_root in enumerate(roots):
            if j != i and root.is_relative_to(other_root):
                problems.append(
                    f"{where}: {root} is inside (or equal to) tenant {tenants[j].tenant_id!r}'s workspace"
                    f" root {other_root}; every tenant needs a root of its own, apart from the others"
                )
