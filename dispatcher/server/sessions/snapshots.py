"""Snapshots of sessions and forks (``SnapshotSession``, ``ListSnapshots``, ``DeleteSnapshot``,
``CreateSession{snapshot_id}``, ``ForkSession``).

A snapshot is two directories under ``<home>/snapshots/<tenant>/<id>/``: ``workspace/`` and
``tmp/`` (the sandbox's tmpfs, ``$HOME`` inside it), copied while the sandbox is held still
(``SandboxProvider.capture``: frozen for the copy, or already paused), and one ``state.db`` row,
written once the files are complete: a directory without a row is an interrupted copy, removed at
start. Memory and processes are not kept. A fork is a snapshot nobody names, copied into each
child and removed.

A copy out of a session is bounded while it is written (``sandbox/tree_copy.py``): its budget is
what the tenant's ``max_snapshot_bytes`` leaves (its snapshots and the forks' copies under way
counted) and ``max_snapshot_entries``; past either it stops, is removed, and the request is
RESOURCE_EXHAUSTED. Copies from a snapshot into a new session use ``cp --reflink=auto``
(copy-on-write where the filesystem offers it): their source was bounded when it was taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from dispatcher.core.provider_api import CopyBudget, CopyBudgetExceeded, SandboxProvider, SnapshotUnsupported
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.types import Role
from dispatcher.sandbox.tree_copy import TreeTooDeep, copy_tree, run_copy
from dispatcher.sandbox.tree_size import tree_bytes
from dispatcher.server.persistence.store import SessionStore
from dispatcher.server.requests.checks import check_id
from dispatcher.server.requests.errors import (
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    SandboxUnavailable,
    status_for,
)
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import Tenant, resolve_workspace
from dispatcher.wire.convert_snapshots import ForkFailure, SnapshotInfo

__all__ = ["MAX_FORK", "ForkFailure", "SnapshotInfo", "Snapshots"]

log = logging.getLogger("dispatcher.server.sessions.snapshots")

MAX_FORK = 100
"""Children one ForkSession may ask for (the tenant's ``max_sessions`` bounds them too)."""
MAX_NAME = 128
COPIES_AT_ONCE = 4
"""Children's workspaces copied at once (their containers launch as the backend's slots allow)."""
ALL_ENTRIES = 50_000_000
"""A snapshot is measured whole (its bytes are its tenant's bound)."""


class Snapshots:
    """Takes, keeps, lists and deletes each tenant's snapshots; starts sessions and forks from them."""

    def __init__(
        self, sessions: SessionManager, provider: SandboxProvider, store: SessionStore | None, root: Path
    ) -> None:
        """``root``: where the files live (``<home>/snapshots``); ``store``: the rows (None: kept
        in memory only, as the sessions are)."""
        self._sessions = sessions
        self._provider = provider
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
        async with self._tenant_lock(tenant.tenant_id):  # one bound check and copy at a time
            mine = self.list_for(tenant)
            quotas = tenant.quotas
            if len(mine) >= quotas.max_snapshots:
                raise QuotaExceeded(
                    f"tenant {tenant.tenant_id!r} already has {quotas.max_snapshots} snapshots"
                    " (quotas.max_snapshots): delete one first"
                )
            used = self._used(tenant)
            snapshot_id = f"snap_{secrets.token_hex(12)}"
            target = self._root / tenant.tenant_id / snapshot_id
            try:
                has_tmp = await self._capture(state, target, tenant, used, "snapshot")
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
                if self._store is not None:
                    row = (
                        snapshot_id,
                        tenant.tenant_id,
                        name,
                        session_id,
                        info.create_time,
                        size,
                        int(has_tmp),
                    )
                    await asyncio.to_thread(self._store.put_snapshot, row)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, target, True)
                raise
            self._known[snapshot_id] = info
        log.info(
            "snapshot taken",
            extra={"tenant_id": tenant.tenant_id, "session_id": session_id, "snapshot_id": snapshot_id},
        )
        return info

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

    async def delete(self, tenant: Tenant, snapshot_id: str) -> int:
        """Remove the snapshot's row and files; returns the bytes freed.

        Raises:
            NotFound: no such snapshot of this tenant's.
        """
        info = self.get(tenant, snapshot_id)
        async with self._tenant_lock(tenant.tenant_id):
            if self._known.pop(snapshot_id, None) is None:
                raise NotFound(f"no snapshot {snapshot_id!r}")
            async with self._read_done:  # no new reader from here: wait for those filling
                await self._read_done.wait_for(lambda: not self._readers.get(snapshot_id))
            if self._store is not None:
                await asyncio.to_thread(self._store.delete_snapshot, snapshot_id)
            await asyncio.to_thread(shutil.rmtree, self._root / tenant.tenant_id / snapshot_id, True)
        return info.size_bytes

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
        source = self._root / tenant.tenant_id / snapshot_id
        name = workspace.strip() or f"snapshots/{snapshot_id}-{secrets.token_hex(3)}"
        _, path = resolve_workspace(tenant, name)
        if any(path.iterdir()):
            raise InvalidRequest(
                f"workspace: {name!r} is not empty; a session from a snapshot starts in a new or empty"
                " workspace (leave workspace unset for a new one)"
            )
        try:
            with self._reading(snapshot_id):
                state = self._sessions.create(tenant, name, **create)  # type: ignore[arg-type]
                await self._fill(tenant, state, source, info.has_tmp)
        finally:
            await self._read_finished()  # after the count dropped: a delete waiting looks again
        return state

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
                keep = self._root / tenant.tenant_id / f".fork-{secrets.token_hex(8)}"
                # The copy lives until the children are filled: it counts with the snapshots.
                async with self._tenant_lock(tenant.tenant_id):
                    has_tmp = await self._capture(parent, keep, tenant, self._used(tenant), "fork")
                    held = await asyncio.to_thread(tree_bytes, str(keep), ALL_ENTRIES)
                    self._fork_bytes[tenant.tenant_id] = self._fork_bytes.get(tenant.tenant_id, 0) + held
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
                info = self.get(tenant, snapshot_id)
                source, has_tmp = self._root / tenant.tenant_id / snapshot_id, info.has_tmp
                create = {"role": Role.MAIN, "labels": dict(labels or {})}
                base = f"snapshots/{snapshot_id}"
            create["ttl_seconds"] = ttl_seconds
            create["idle_timeout_seconds"] = idle_timeout_seconds
            return await self._fork_children(tenant, snapshot_id, source, has_tmp, base, create, count)
        finally:
            if keep is not None:
                await asyncio.to_thread(shutil.rmtree, keep, True)
                left = self._fork_bytes.pop(tenant.tenant_id, 0) - held
                if left:
                    self._fork_bytes[tenant.tenant_id] = left

    async def _fork_children(
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
                await self._fill(tenant, state, source, has_tmp, gate)
            except Exception as exc:
                code, message = status_for(exc)
                return ForkFailure(code.name, message)
            return state

        try:
            with self._reading(snapshot_id):
                # Made in order (so the quota refuses the last ones), then filled a few at a time.
                return list(await asyncio.gather(*(child(i) for i in range(count))))
        finally:
            await self._read_finished()

    # --- copies --------------------------------------------------------------------------------

    def _used(self, tenant: Tenant) -> int:
        """Bytes the tenant's snapshots and fork copies hold now (call under its lock)."""
        return sum(s.size_bytes for s in self.list_for(tenant)) + self._fork_bytes.get(tenant.tenant_id, 0)

    async def _capture(self, state: SessionState, target: Path, tenant: Tenant, used: int, what: str) -> bool:
        """The session's /tmp and workspace into ``target`` (made here), its sandbox held still,
        within what the tenant's bounds leave (``used``: the bytes its copies hold already).

        Raises:
            QuotaExceeded: the copy would pass them; it stopped there and was removed.
            FailedPrecondition: the backend cannot copy a sandbox, or the tree nests too deep.
            SandboxUnavailable: the copy failed.
        """
        session = state.session
        quotas = tenant.quotas
        budget = CopyBudget(quotas.max_snapshot_bytes - used, quotas.max_snapshot_entries)
        await asyncio.to_thread(target.mkdir, 0o700, True, False)

        async def copy_workspace() -> None:
            dest = str(target / "workspace")
            copy = functools.partial(
                copy_tree, session.workspace_path, dest, budget, label="workspace", keep_root=True
            )
            try:
                await run_copy(budget, copy)
            except OSError as exc:
                raise SandboxError(f"copying the session's workspace failed: {exc}") from exc

        try:
            return await self._provider.capture(session, str(target / "tmp"), copy_workspace, budget)
        except BaseException as exc:
            await asyncio.to_thread(shutil.rmtree, target, True)  # nothing half copied stays
            if isinstance(exc, CopyBudgetExceeded):
                raise QuotaExceeded(_past_budget(exc, what, used, quotas.max_snapshot_bytes)) from exc
            if isinstance(exc, TreeTooDeep):
                raise FailedPrecondition(f"the session could not be copied: {exc}") from exc
            if isinstance(exc, SnapshotUnsupported):
                raise FailedPrecondition(str(exc)) from exc
            if isinstance(exc, SandboxError):
                raise SandboxUnavailable(f"the session could not be copied: {exc}") from exc
            raise

    async def _fill(
        self,
        tenant: Tenant,
        state: SessionState,
        source: Path,
        has_tmp: bool,
        copies: asyncio.Semaphore | None = None,
    ) -> None:
        """Copy ``source``'s workspace into the new session's (holding ``copies``, if given) and
        start its sandbox with the /tmp (launches are bounded by the backend's own launch slots);
        on failure the session is closed."""
        try:
            async with copies or contextlib.nullcontext():
                await _cp(str(source / "workspace"), state.session.workspace_path)
            if has_tmp:
                await self._provider.seed_tmp(state.session, str(source / "tmp"))
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await self._sessions.close(tenant, state.session.session_id)
            if isinstance(exc, SnapshotUnsupported):
                raise FailedPrecondition(str(exc)) from exc
            if isinstance(exc, SandboxError):
                raise SandboxUnavailable(
                    f"the new session could not be started from the copy: {exc}"
                ) from exc
            raise

    @contextlib.contextmanager
    def _reading(self, snapshot_id: str) -> Iterator[None]:
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

    async def _read_finished(self) -> None:
        async with self._read_done:
            self._read_done.notify_all()

    def _tenant_lock(self, tenant_id: str) -> asyncio.Lock:
        return self._tenant_locks.setdefault(tenant_id, asyncio.Lock())


def _past_budget(exc: CopyBudgetExceeded, what: str, used: int, max_bytes: int) -> str:
    """What a client is told when a copy stopped at its budget: how far it got, which bound, and
    what to do."""
    got = (
        f"the {what}'s copy stopped at {exc.where} after {exc.copied_bytes:,} bytes in"
        f" {exc.copied_entries:,} entries"
    )
    if exc.unit == "entries":
        bound = f"the next entry would pass quotas.max_snapshot_entries ({exc.copied_entries:,})"
    else:
        bound = (
            f"the tenant's snapshots (and forks under way) already hold {used:,} bytes and the next"
            f" entry would pass quotas.max_snapshot_bytes ({max_bytes:,})"
        )
    return (
        f"{got}: {bound}; nothing was kept: delete a snapshot or remove files from the workspace"
        " (or its /tmp)"
    )


async def _cp(source: str, dest: str) -> None:
    """``source``'s contents into the directory ``dest`` (made if missing): owners, modes, times
    and links kept, copy-on-write where the filesystem offers it.

    Raises:
        SandboxError: cp failed (its message).
    """
    await asyncio.to_thread(os.makedirs, dest, 0o755, True)
    proc = await asyncio.create_subprocess_exec(
        "cp",
        "-a",
        "--reflink=auto",
        "--",
        f"{source}/.",
        dest,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"copying {source} failed: {err.decode(errors='replace').strip()[-500:]}")
