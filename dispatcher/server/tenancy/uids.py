"""Per-tenant host uid/gid: explicit in the config, else allocated once and kept in ``<home>/uids.json``.

Kernel limits such as inotify instances, user watches, keys and ``RLIMIT_NPROC`` are counted per
uid, so tenants sharing one uid share (and can exhaust) them. Each tenant of a ``tenants:`` config
therefore gets its own. Allocation is first come, first served in the configured range, and
persisted: a tenant keeps its uid across restarts and config reorderings (the files in its
workspaces stay its own), and a uid once given is never handed to another tenant, not even after
the first one left the config.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from dispatcher.config.sections import MAX_ID, UidRange
from dispatcher.core.errors import ConfigError

UIDS_FILE = "uids.json"


def allocate(
    path: Path,
    tenant_ids: Iterable[str],
    explicit: Mapping[str, int],
    uid_range: UidRange,
) -> dict[str, tuple[int, int]]:
    """The (uid, gid) of every tenant in ``tenant_ids`` that has no explicit uid.

    Reads and updates ``path`` under an exclusive lock, writing it atomically (temp file, fsync,
    rename) only when something new was allocated.

    Raises:
        ConfigError: the file is unreadable or malformed, the range is full, or an explicit uid is
            already allocated to another tenant.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock_fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        known = _load(path)
        owners = {uid: tenant for tenant, uid in known.items()}
        for tenant, uid in explicit.items():
            owner = owners.get(uid)
            if owner is not None and owner != tenant:
                raise ConfigError(
                    f"tenants.{tenant}.uid: {uid} was allocated to tenant {owner!r} ({path});"
                    " two tenants never share a uid"
                )
        taken = set(owners) | set(explicit.values())
        out: dict[str, tuple[int, int]] = {}
        changed = False
        candidate = uid_range.start
        for tenant in tenant_ids:
            if tenant in explicit:
                continue
            kept = known.get(tenant)
            if kept is None:
                while candidate in taken:
                    candidate += 1
                if candidate not in uid_range:
                    raise ConfigError(
                        f"tenant_uids: the range {uid_range.start}+{uid_range.count} is full"
                        f" (allocations are kept in {path})"
                    )
                kept = known[tenant] = candidate
                taken.add(kept)
                changed = True
            out[tenant] = (kept, kept)
        if changed:
            _store(path, known)
        return out
    finally:
        os.close(lock_fd)


def _load(path: Path) -> dict[str, int]:
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the tenant uid allocations: {exc.strerror}") from exc
    try:
        data = json.loads(raw)
        tenants = data["tenants"]
        if not isinstance(tenants, dict):
            raise TypeError
        known = {str(k): v for k, v in tenants.items()}
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path}: malformed tenant uid allocations (restore it from a backup)") from None
    seen: set[int] = set()
    for tenant, uid in known.items():
        if type(uid) is not int or not 0 < uid <= MAX_ID or uid in seen:
            raise ConfigError(f"{path}: bad or duplicate uid for tenant {tenant!r}")
        seen.add(uid)
    return known


def _store(path: Path, known: Mapping[str, int]) -> None:
    body = json.dumps({"version": 1, "tenants": dict(sorted(known.items()))}, indent=1) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
