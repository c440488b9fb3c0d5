"""``Snapshots``: what the snapshot RPCs and CreateSession{snapshot_id} call. It takes a snapshot
and starts a session from one here, over the records (``records.py``), the copies (``copies.py``)
and the forks (``forks.py``)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.sessions.state import SessionState
from dispatcher.sandbox.tree_size import tree_bytes
from dispatcher.server.persistence.store import SessionStore
from dispatcher.server.requests.errors import InvalidRequest, QuotaExceeded
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.sessions.snapshots.copies import ALL_ENTRIES, capture, fill
from dispatcher.server.sessions.snapshots.forks import Forks
from dispatcher.server.sessions.snapshots.records import SnapshotRecords
from dispatcher.server.tenancy.tenants import Tenant, resolve_workspace
from dispatcher.wire.convert_snapshots import SnapshotInfo

log = logging.getLogger("dispatcher.server.sessions.snapshots")

MAX_NAME = 128


class Snapshots:
    """Takes, keeps, lists and deletes each tenant's snapshots; starts sessions and forks from them."""

    def __init__(
        self, sessions: SessionManager, provider: SandboxProvider, store: SessionStore | None, root: Path
    ) -> None:
        """``root``: where the files live (``<home>/snapshots``); ``store``: the rows (None: kept
        in memory only, as the sessions are)."""
        self._sessions = sessions
        self._provider = provider
        self._records = SnapshotRecords(store, root)
        self._forks = Forks(self._records, sessions, provider)
        self.fork = self._forks.fork
        """``count`` children of a session or of a snapshot (``Forks.fork``)."""

    def load(self) -> None:
        """The stored snapshots; directories of copies a kill interrupted are removed."""
        self._records.load()

    # --- snapshots -----------------------------------------------------------------------------

    async def take(self, tenant: Tenant, session_id: str, name: str) -> SnapshotInfo:
        """Copy the session's workspace and /tmp into a new snapshot of the tenant's.

        Raises:
            UnknownSessionError: no such session of this tenant.
            InvalidRequest: the name is too long.
            QuotaExceeded: the tenant's ``max_snapshots``, ``max_snapshot_bytes`` or
                ``max_snapshot_entries`` would be passed (the copy stopped there, nothing kept).
            FailedPrecondition: the backend cannot copy a sandbox.
            SandboxUnavailable: the copy failed.
        """
        if len(name) > MAX_NAME:
            raise InvalidRequest(f"name: at most {MAX_NAME} characters, got {len(name):,}")
        state = self._sessions.get(tenant, session_id)
        async with self._records.tenant_lock(tenant.tenant_id):  # one bound check and copy at a time
            mine = self.list_for(tenant)
            quotas = tenant.quotas
            if len(mine) >= quotas.max_snapshots:
                raise QuotaExceeded(
                    f"tenant {tenant.tenant_id!r} already has {quotas.max_snapshots} snapshots"
                    " (quotas.max_snapshots): delete one first"
                )
            used = self._records.used(tenant)
            snapshot_id = f"snap_{secrets.token_hex(12)}"
            target = self._records.directory(tenant.tenant_id, snapshot_id)
            try:
                has_tmp = await capture(self._provider, state, target, tenant, used, "snapshot")
                # As du measures it (the bound's unit): a filesystem whose blocks are larger than
                # the copy counted may still pass it by those.
                size = await asyncio.to_thread(tree_bytes, str(target), ALL_ENTRIES)
                if used + size > quotas.max_snapshot_bytes:
                    raise QuotaExceeded(
                        f"this snapshot takes {size:,} bytes and the tenant's snapshots already"
                        f" {used:,}: past quotas.max_snapshot_bytes ({quotas.max_snapshot_bytes:,});"
                        " delete a snapshot or remove files from the workspace"
                    )
                info = SnapshotInfo(
                    snapshot_id, name, tenant.tenant_id, session_id, time.time(), size, has_tmp
                )
                await self._records.add(info)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, target, True)
                raise
        log.info(
            "snapshot taken",
            extra={"tenant_id": tenant.tenant_id, "session_id": session_id, "snapshot_id": snapshot_id},
        )
        return info

    def list_for(self, tenant: Tenant) -> list[SnapshotInfo]:
        return self._records.list_for(tenant)

    def get(self, tenant: Tenant, snapshot_id: str) -> SnapshotInfo:
        """Raises: NotFound: no such snapshot of this tenant's (another tenant's looks the same)."""
        return self._records.get(tenant, snapshot_id)

    async def delete(self, tenant: Tenant, snapshot_id: str) -> int:
        """Remove the snapshot's row and files; returns the bytes freed.

        Raises:
            NotFound: no such snapshot of this tenant's.
        """
        return await self._records.delete(tenant, snapshot_id)

    # --- sessions from them --------------------------------------------------------------------

    async def create_from(
        self,
        tenant: Tenant,
        snapshot_id: str,
        workspace: str,
        create: Mapping[str, object],
    ) -> SessionState:
        """A new session (``SessionManager.create`` with ``create``'s keywords) in a new or empty
        workspace filled from the snapshot, its sandbox started with the snapshot's /tmp.

        Raises:
            NotFound: no such snapshot of this tenant's.
            InvalidRequest: the workspace named is not empty.
            FailedPrecondition, SandboxUnavailable: as ``take``; and what ``create`` raises.
        """
        info = self.get(tenant, snapshot_id)
        source = self._records.directory(tenant.tenant_id, snapshot_id)
        name = workspace.strip() or f"snapshots/{snapshot_id}-{secrets.token_hex(3)}"
        _, path = resolve_workspace(tenant, name)
        if any(path.iterdir()):
            raise InvalidRequest(
                f"workspace: {name!r} is not empty; a session from a snapshot starts in a new or empty"
                " workspace (leave workspace unset for a new one)"
            )
        try:
            with self._records.reading(snapshot_id):
                state = self._sessions.create(tenant, name, **create)  # type: ignore[arg-type]
                await fill(self._provider, self._sessions, tenant, state, source, info.has_tmp)
        finally:
            await self._records.read_finished()  # after the count dropped: a delete waiting looks again
        return state
