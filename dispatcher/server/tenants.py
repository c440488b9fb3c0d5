"""Tenants: who a bearer token is, where its workspaces live, and what it may do."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dispatcher.config import Quotas, TenantConfig, UidRange
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.policy import ConfirmationPolicy
from dispatcher.server.errors import InvalidRequest, Unauthenticated
from dispatcher.server.uids import allocate

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


class TenantDirectory:
    """Maps bearer tokens to tenants by their sha256; the tokens themselves are never kept."""

    def __init__(
        self,
        tenants: Iterable[TenantConfig],
        base_policy: ConfirmationPolicy,
        *,
        uid_range: UidRange | None = None,
        uid_file: Path | None = None,
    ) -> None:
        """With ``uid_range``, each tenant without an explicit uid gets one, kept in ``uid_file``.

        Raises:
            ConfigError: the allocation failed (see ``dispatcher.server.uids.allocate``).
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
            tenant = Tenant(
                tenant_id=cfg.tenant_id,
                workspace_root=cfg.workspace_root,
                capabilities=cfg.capabilities,
                policy=base_policy.merged(
                    cfg.policy_overrides, where=f"tenants.{cfg.tenant_id}.tool_confirmation"
                ),
                quotas=cfg.quotas,
                uid=uid,
                gid=gid,
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
    real_root = Path(os.path.realpath(root))
    # Sandboxes write inside workspaces, so a component may be a symlink a sandbox planted. Walk
    # down with directory fds that never follow one: nothing below the root is created or opened
    # through a link, and nothing can be swapped in between a check and its use.
    fd = os.open(real_root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                raise InvalidRequest(
                    f"workspace: {name!r} is not a directory under the tenant's workspace root"
                    " (a symlink or a file is in the way)"
                ) from None
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    real = real_root.joinpath(*parts)
    return "/".join(parts), real
