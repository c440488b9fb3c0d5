"""Each tenant's snapshots as the server keeps them: one ``state.db`` row and one directory each,
the bytes they and the forks' copies under way hold, one lock per tenant for the bound checks, and
the sessions being filled from a snapshot now (a delete waits for them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

from dispatcher.server.persistence.store import SessionStore
from dispatcher.server.requests.checks import check_id
from dispatcher.server.requests.errors import NotFound
from dispatcher.server.tenancy.tenants import Tenant
from dispatcher.wire.convert_snapshots import SnapshotInfo

log = logging.getLogger("dispatcher.server.sessions.snapshots")


class SnapshotRecords:
    """The snapshots of every tenant: their rows, their files under ``root`` and who uses them."""

    def __init__(self, store: SessionStore | None, root: Path) -> None:
        """``root``: where the files live (``<home>/snapshots``); ``store``: the rows (None: kept
        in memory only, as the sessions are)."""
        self._store = store
        self._root = root
        self._known: dict[str, SnapshotInfo] = {}
        self._tenant_locks: dict[str, asyncio.Lock] = {}
        self._readers: dict[str, int] = {}
        """Sessions being filled from each snapshot now: a delete waits for them."""
        self._read_done = asyncio.Condition()
        self._fork_bytes: dict[str, int] = {}
        """Bytes of each tenant's fork copies on disk now (counted with its snapshots' bytes)."""

    def load(self) -> None:
        """The stored snapshots; directories of copies a kill interrupted are removed."""
        if self._store is not None:
            for row in self._store.load_snapshots():
                info = SnapshotInfo(row[0], row[2], row[1], row[3], row[4], row[5], bool(row[6]))
                self._known[info.snapshot_id] = info
        if not self._root.is_dir():
            return
        for tenant_dir in self._root.iterdir():
            for entry in tenant_dir.iterdir() if tenant_dir.is_dir() else ():
                known = self._known.get(entry.name)
                if known is None or known.tenant != tenant_dir.name:
                    log.info("removing an unfinished snapshot copy: %s", entry)
                    shutil.rmtree(entry, ignore_errors=True)

    def directory(self, tenant_id: str, name: str) -> Path:
        """Where the tenant's snapshot (or fork copy) ``name`` has its files."""
        return self._root / tenant_id / name

    def list_for(self, tenant: Tenant) -> list[SnapshotInfo]:
        return sorted(
            (s for s in self._known.values() if s.tenant == tenant.tenant_id), key=lambda s: s.create_time
        )

    def get(self, tenant: Tenant, snapshot_id: str) -> SnapshotInfo:
        """Raises: NotFound: no such snapshot of this tenant's (another tenant's looks the same)."""
        check_id("snapshot_id", snapshot_id)
        info = self._known.get(snapshot_id)
        if info is None or info.tenant != tenant.tenant_id:
            raise NotFound(f"no snapshot {snapshot_id!r}")
        return info

    async def add(self, info: SnapshotInfo) -> None:
        """Keep a snapshot whose files are complete: its row first, then it is known."""
        if self._store is not None:
            row = (
                info.snapshot_id,
                info.tenant,
                info.name,
                info.source_session_id,
                info.create_time,
                info.size_bytes,
                int(info.has_tmp),
            )
            await asyncio.to_thread(self._store.put_snapshot, row)
        self._known[info.snapshot_id] = info

    async def delete(self, tenant: Tenant, snapshot_id: str) -> int:
        """Remove the snapshot's row and files; returns the bytes freed.

        Raises:
            NotFound: no such snapshot of this tenant's.
        """
        info = self.get(tenant, snapshot_id)
        async with self.tenant_lock(tenant.tenant_id):
            if self._known.pop(snapshot_id, None) is None:
                raise NotFound(f"no snapshot {snapshot_id!r}")
            async with self._read_done:  # no new reader from here: wait for those filling
                await self._read_done.wait_for(lambda: not self._readers.get(snapshot_id))
            if self._store is not None:
                await asyncio.to_thread(self._store.delete_snapshot, snapshot_id)
            await asyncio.to_thread(shutil.rmtree, self.directory(tenant.tenant_id, snapshot_id), True)
        return info.size_bytes

    def used(self, tenant: Tenant) -> int:
        """Bytes the tenant's snapshots and fork copies hold now (call under its lock)."""
        return sum(s.size_bytes for s in self.list_for(tenant)) + self._fork_bytes.get(tenant.tenant_id, 0)

    def hold_fork_copy(self, tenant_id: str, size: int) -> None:
        """Count a fork's copy of a session, on disk until its children are filled."""
        self._fork_bytes[tenant_id] = self._fork_bytes.get(tenant_id, 0) + size

    def drop_fork_copy(self, tenant_id: str, size: int) -> None:
        """The fork's copy is removed: its bytes no longer count."""
        left = self._fork_bytes.pop(tenant_id, 0) - size
        if left:
            self._fork_bytes[tenant_id] = left

    @contextlib.contextmanager
    def reading(self, snapshot_id: str) -> Iterator[None]:
        """Count a session being filled from ``snapshot_id`` ("": none) for the block."""
        if snapshot_id:
            self._readers[snapshot_id] = self._readers.get(snapshot_id, 0) + 1
        try:
            yield
        finally:
            if snapshot_id:
                left = self._readers.pop(snapshot_id) - 1
                if left:
                    self._readers[snapshot_id] = left

    async def read_finished(self) -> None:
        """Tell a delete waiting for readers to look again (after ``reading``'s count dropped)."""
        async with self._read_done:
            self._read_done.notify_all()

    def tenant_lock(self, tenant_id: str) -> asyncio.Lock:
        """One bound check and copy at a time per tenant."""
        return self._tenant_locks.setdefault(tenant_id, asyncio.Lock())
