"""Copies of a session's files: out of it into a snapshot or a fork's copy, within what the
tenant's bounds leave (``sandbox/tree_copy.py`` stops a copy at its budget), its sandbox held still;
and from such a copy into a new session, with ``cp --reflink=auto`` (copy-on-write where the
filesystem offers it: the source was bounded when it was taken), its sandbox started with the /tmp."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
from pathlib import Path

from dispatcher.core.provider_api import CopyBudget, CopyBudgetExceeded, SandboxProvider, SnapshotUnsupported
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.state import SessionState
from dispatcher.sandbox.tree_copy import TreeTooDeep, copy_tree, run_copy
from dispatcher.server.requests.errors import FailedPrecondition, QuotaExceeded, SandboxUnavailable
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import Tenant

ALL_ENTRIES = 50_000_000
"""A snapshot is measured whole (its bytes are its tenant's bound)."""


async def capture(
    provider: SandboxProvider, state: SessionState, target: Path, tenant: Tenant, used: int, what: str
) -> bool:
    """The session's /tmp and workspace into ``target`` (made here), its sandbox held still,
    within what the tenant's bounds leave (``used``: the bytes its copies hold already); whether
    the /tmp was copied.

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
        return await provider.capture(session, str(target / "tmp"), copy_workspace, budget)
    except BaseException as exc:
        await asyncio.to_thread(shutil.rmtree, target, True)  # nothing half copied stays
        if isinstance(exc, CopyBudgetExceeded):
            raise QuotaExceeded(past_budget(exc, what, used, quotas.max_snapshot_bytes)) from exc
        if isinstance(exc, TreeTooDeep):
            raise FailedPrecondition(f"the session could not be copied: {exc}") from exc
        if isinstance(exc, SnapshotUnsupported):
            raise FailedPrecondition(str(exc)) from exc
        if isinstance(exc, SandboxError):
            raise SandboxUnavailable(f"the session could not be copied: {exc}") from exc
        raise


def past_budget(exc: CopyBudgetExceeded, what: str, used: int, max_bytes: int) -> str:
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


async def fill(
    provider: SandboxProvider,
    sessions: SessionManager,
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
            await cp(str(source / "workspace"), state.session.workspace_path)
        if has_tmp:
            await provider.seed_tmp(state.session, str(source / "tmp"))
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await sessions.close(tenant, state.session.session_id)
        if isinstance(exc, SnapshotUnsupported):
            raise FailedPrecondition(str(exc)) from exc
        if isinstance(exc, SandboxError):
            raise SandboxUnavailable(f"the new session could not be started from the copy: {exc}") from exc
        raise


async def cp(source: str, dest: str) -> None:
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
