"""Tenants: who a bearer token is, where its workspaces live, and what it may do."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from dispatcher.config.load import TenantConfig
from dispatcher.config.policy import DEFAULT_APPROVAL_MODES
from dispatcher.config.sections import Quotas, UidRange
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy
from dispatcher.core.call.approve import ApprovalMode, parse_mode
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.egress.policy import EgressPolicy
from dispatcher.sandbox.workspace_pin import WorkspaceRefused, open_pinned
from dispatcher.server.requests.errors import InvalidRequest, Unauthenticated
from dispatcher.server.tenancy.uids import allocate

_WORKSPACE_PART_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}$")
MAX_WORKSPACE_DEPTH = 8
DEFAULT_WORKSPACE = "default"


@dataclass(frozen=True, slots=True)
class Tenant:
    """A tenant as the server applies it: the server policy with the tenant's overrides laid over."""

    tenant_id: str
    workspace_root: Path
    capabilities: Capabilities
    policy: ConfirmationPolicy
    quotas: Quotas
    uid: int | None = None
    """Host uid of the tenant's sandboxes (None: the sandbox backend's configured user)."""
    gid: int | None = None
    approval_modes: tuple[ApprovalMode, ...] = DEFAULT_APPROVAL_MODES
    """The modes its sessions may choose (``tenants[].approval_modes``); the first is the default."""
    approval_modes_key: str = "top-level approval_modes"
    """The config key an operator sets to allow another mode (a refusal names it)."""
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """What its sandboxes reach through the egress proxy; ``capabilities.egress_allow`` is its list."""
    max_session_ttl_seconds: float | None = None
    """The longest TTL its sessions may have, and the longest they may live from creation, renewals
    and pauses included (``tenants[].max_session_ttl_seconds``)."""


def allowed_mode(tenant: Tenant, name: str | None) -> ApprovalMode:
    """The approval mode a new session of ``tenant`` runs in: ``name``, or (None or "") the first
    of the tenant's ``approval_modes``.

    Raises:
        ValueError: an unknown mode, or one the tenant's ``approval_modes`` does not list.
    """
    if not name:
        return tenant.approval_modes[0]
    mode = parse_mode(name)
    if mode not in tenant.approval_modes:
        allowed = ", ".join(m.value for m in tenant.approval_modes)
        raise ValueError(
            f"approval_mode: tenant {tenant.tenant_id!r} does not allow {mode.value!r} (allowed: {allowed});"
            f" the server's operator allows it by listing it in the config's {tenant.approval_modes_key}"
        )
    return mode


def plan_approved_mode(tenant: Tenant) -> ApprovalMode | None:
    """What an approved plan switches its session to: autonomous, or cautious where the tenant does
    not allow autonomous (its calls then still ask as its policy says); None: neither is allowed."""
    for mode in (ApprovalMode.AUTONOMOUS, ApprovalMode.CAUTIOUS):
        if mode in tenant.approval_modes:
            return mode
    return None


@dataclass(frozen=True, slots=True)
class DefaultIds:
    """Who a tenant's sandboxes run as when neither its ``uid:`` nor ``tenant_uids`` says."""

    configured: tuple[int, int] | None
    """``sandbox.user`` (its default 1000:1000 included) when numeric."""
    follow_owner: bool
    """``sandbox.user`` is not set: the owner of the tenant's workspace root, so files a sandbox
    writes stay the developer's; ``configured`` when that owner is root (never run as root)."""

    def for_root(self, root: Path) -> tuple[int, int] | None:
        """The uid/gid for a tenant whose workspaces live under ``root``."""
        if not self.follow_owner:
            return self.configured
        try:
            st = os.stat(root)
            uid, gid = st.st_uid, st.st_gid
        except FileNotFoundError:  # the server makes it on first use: it will be the server's
            uid, gid = os.geteuid(), os.getegid()
        if uid == 0:
            return self.configured
        return uid, gid or uid


def default_sandbox_ids(sandbox_user: str | None, configured: tuple[int, int] | None) -> DefaultIds:
    """``DefaultIds`` from the ``sandbox.user`` the config file gives (None: not set)."""
    return DefaultIds(configured=configured, follow_owner=sandbox_user is None)


class TenantDirectory:
    """Maps bearer tokens to tenants by their sha256; the tokens themselves are never kept."""

    def __init__(
        self,
        tenants: Iterable[TenantConfig],
        base_policy: ConfirmationPolicy,
        *,
        uid_range: UidRange | None = None,
        uid_file: Path | None = None,
        default_ids: DefaultIds | None = None,
    ) -> None:
        """With ``uid_range``, each tenant without an explicit uid gets one, kept in ``uid_file``;
        a tenant that still has none gets ``default_ids`` (None: the sandbox backend decides).

        Raises:
            ConfigError: the allocation failed (see ``dispatcher.server.tenancy.uids.allocate``).
        """
        self._by_hash: dict[str, Tenant] = {}
        self._by_id: dict[str, Tenant] = {}
        tenants = tuple(tenants)
        ids: dict[str, tuple[int, int]] = {}
        if uid_range is not None:
            if uid_file is None:
                raise ValueError("uid_file is required with uid_range")
            explicit = {t.tenant_id: t.uid for t in tenants if t.uid is not None}
            ids = allocate(uid_file, (t.tenant_id for t in tenants), explicit, uid_range)
        for cfg in tenants:
            uid, gid = (cfg.uid, cfg.gid) if cfg.uid is not None else ids.get(cfg.tenant_id, (None, None))
            if uid is None and default_ids is not None:
                uid, gid = default_ids.for_root(cfg.workspace_root) or (None, None)
            tenant = Tenant(
                tenant_id=cfg.tenant_id,
                workspace_root=cfg.workspace_root,
                capabilities=cfg.capabilities,
                policy=base_policy.merged(cfg.policy_overrides),
                quotas=cfg.quotas,
                uid=uid,
                gid=gid,
                approval_modes=cfg.approval_modes,
                approval_modes_key=cfg.approval_modes_key,
                egress=cfg.egress,
                max_session_ttl_seconds=cfg.max_session_ttl_seconds,
            )
            self._by_id[tenant.tenant_id] = tenant
            for digest in cfg.token_sha256:
                self._by_hash[digest] = tenant

    def authenticate(self, authorization: str | None) -> Tenant:
        """The tenant of an ``authorization: Bearer <token>`` header value.

        Raises:
            Unauthenticated: missing header, wrong scheme, or a token of no tenant.
        """
        if not authorization:
            raise Unauthenticated("missing 'authorization: Bearer <token>' metadata")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("authorization must be 'Bearer <token>'")
        # Lookup by digest: the dict probe compares digests of secret input, which leaks nothing useful.
        tenant = self._by_hash.get(hashlib.sha256(token.strip().encode("utf-8")).hexdigest())
        if tenant is None:
            raise Unauthenticated("unknown token")
        return tenant

    def get(self, tenant_id: str) -> Tenant:
        return self._by_id[tenant_id]


def resolve_workspace(tenant: Tenant, name: str) -> tuple[str, Path]:
    """Normalise a workspace name and create its directory under the tenant's root.

    Directories it makes belong to the tenant's sandbox uid/gid from the start (when the server
    is root and the tenant has them), so a sandbox can write there and nothing that already
    exists is ever re-owned.

    Returns (normalised name, absolute real path).

    Raises:
        InvalidRequest: absolute, ``..``, odd characters, too deep, or (through a symlink already
            under the root) resolving outside it.
    """
    raw = name.strip() or DEFAULT_WORKSPACE
    if "\\" in raw or "\x00" in raw or raw.startswith("/") or raw.startswith("~"):
        raise InvalidRequest(f"workspace: {name!r} must be a relative name under the tenant's workspace root")
    parts = [p for p in PurePosixPath(raw).parts if p != "."]
    if not parts or len(parts) > MAX_WORKSPACE_DEPTH or not all(_WORKSPACE_PART_RE.match(p) for p in parts):
        raise InvalidRequest(
            f"workspace: {name!r} is not a valid name (parts of letters, digits, '_', '.', '-', '@', '+';"
            f" no '..'; at most {MAX_WORKSPACE_DEPTH} levels)"
        )
    root = tenant.workspace_root
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    owner = None
    if tenant.uid is not None and os.geteuid() == 0:
        owner = (tenant.uid, tenant.gid if tenant.gid is not None else tenant.uid)
    real_root = Path(os.path.realpath(root))
    # Sandboxes write inside workspaces, so a component may be a symlink a sandbox planted: the
    # same walk as every launch's (no link followed, only what it makes handed to the sandbox user).
    try:
        fd = open_pinned(str(real_root), parts, create=True, owner=owner, what=f"workspace {name!r}")
    except WorkspaceRefused:
        raise InvalidRequest(
            f"workspace: {name!r} is not a directory under the tenant's workspace root"
            " (a symlink or a file is in the way)"
        ) from None
    except SandboxError as exc:
        raise InvalidRequest(f"workspace: {name!r} cannot be made: {exc}") from None
    if fd is not None:
        os.close(fd)
    real = real_root.joinpath(*parts)
    return "/".join(parts), real
