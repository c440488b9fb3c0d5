"""ForkSession: ``count`` new sessions from one source, a session (held still for one copy, which
counts with the tenant's snapshots until the children are filled) or a snapshot; each child in its
own new workspace, made in order and filled a few at a time, one result each."""

from __future__ import annotations

import asyncio
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path

from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.types import Role
from dispatcher.sandbox.tree_size import tree_bytes
from dispatcher.server.requests.errors import InvalidRequest, status_for
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.sessions.snapshots.copies import ALL_ENTRIES, capture, fill
from dispatcher.server.sessions.snapshots.records import SnapshotRecords
from dispatcher.server.tenancy.tenants import Tenant
from dispatcher.wire.convert_snapshots import ForkFailure

MAX_FORK = 100
"""Children one ForkSession may ask for (the tenant's ``max_sessions`` bounds them too)."""
COPIES_AT_ONCE = 4
"""Children's workspaces copied at once (their containers launch as the backend's slots allow)."""


class Forks:
    """Forks sessions and snapshots of the records' tenants."""

    def __init__(self, records: SnapshotRecords, sessions: SessionManager, provider: SandboxProvider) -> None:
        self._records = records
        self._sessions = sessions
        self._provider = provider

    async def fork(
        self,
        tenant: Tenant,
        *,
        session_id: str = "",
        snapshot_id: str = "",
        count: int,
        labels: Mapping[str, str] | None,
        ttl_seconds: float | None,
        idle_timeout_seconds: float | None,
    ) -> list[SessionState | ForkFailure]:
        """``count`` children of the session (held still for one copy) or of the snapshot, each
        in its own new workspace; one result per child, in order.

        Raises:
            InvalidRequest: no source, or ``count`` outside 1..``MAX_FORK``.
            UnknownSessionError, NotFound: no such session or snapshot of this tenant's.
            QuotaExceeded: the session's copy would pass what the tenant's
                ``max_snapshot_bytes`` leaves, or ``max_snapshot_entries`` (nothing kept).
            FailedPrecondition, SandboxUnavailable: the source could not be copied.
        """
        if not 1 <= count <= MAX_FORK:
            raise InvalidRequest(f"count: from 1 to {MAX_FORK}, got {count}")
        if bool(session_id) == bool(snapshot_id):
            raise InvalidRequest("name exactly one source: session_id or snapshot_id")
        keep: Path | None = None
        held = 0
        try:
            if session_id:
                parent = self._sessions.get(tenant, session_id)
                keep = self._records.directory(tenant.tenant_id, f".fork-{secrets.token_hex(8)}")
                # The copy lives until the children are filled: it counts with the snapshots.
                async with self._records.tenant_lock(tenant.tenant_id):
                    used = self._records.used(tenant)
                    has_tmp = await capture(self._provider, parent, keep, tenant, used, "fork")
                    held = await asyncio.to_thread(tree_bytes, str(keep), ALL_ENTRIES)
                    self._records.hold_fork_copy(tenant.tenant_id, held)
                source = keep
                s = parent.session
                create: dict[str, object] = {
                    "role": s.role,
                    "labels": dict(labels) if labels else dict(s.labels),
                    "approval_mode": s.approval_mode,
                    "capabilities": s.capabilities,
                }
                base = s.workspace_name
            else:
                info = self._records.get(tenant, snapshot_id)
                source, has_tmp = self._records.directory(tenant.tenant_id, snapshot_id), info.has_tmp
                create = {"role": Role.MAIN, "labels": dict(labels or {})}
                base = f"snapshots/{snapshot_id}"
            create["ttl_seconds"] = ttl_seconds
            create["idle_timeout_seconds"] = idle_timeout_seconds
            return await self._children(tenant, snapshot_id, source, has_tmp, base, create, count)
        finally:
            if keep is not None:
                await asyncio.to_thread(shutil.rmtree, keep, True)
                self._records.drop_fork_copy(tenant.tenant_id, held)

    async def _children(
        self,
        tenant: Tenant,
        snapshot_id: str,
        source: Path,
        has_tmp: bool,
        base: str,
        create: Mapping[str, object],
        count: int,
    ) -> list[SessionState | ForkFailure]:
        gate = asyncio.Semaphore(COPIES_AT_ONCE)

        async def child(i: int) -> SessionState | ForkFailure:
            name = f"forks/{base.replace('/', '-')[:40]}-{secrets.token_hex(4)}"
            try:
                state = self._sessions.create(tenant, name, **create)  # type: ignore[arg-type]
            except Exception as exc:
                code, message = status_for(exc)
                return ForkFailure(code.name, message)
            try:
                await fill(self._provider, self._sessions, tenant, state, source, has_tmp, gate)
            except Exception as exc:
                code, message = status_for(exc)
                return ForkFailure(code.name, message)
            return state

        try:
            with self._records.reading(snapshot_id):
                # Made in order (so the quota refuses the last ones), then filled a few at a time.
                return list(await asyncio.gather(*(child(i) for i in range(count))))
        finally:
            await self._records.read_finished()
