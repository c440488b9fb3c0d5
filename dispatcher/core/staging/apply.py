"""A human's answer to staged changes (``core/staging/area.py``): apply them to the disk, or discard them.

Every write is a compare-and-swap: the sandbox replaces the file (temp file + rename, at the path
resolved when the change was staged, following no link) only if its content still hashes to the
change's base (``expect_sha256``; ``absent``: there must be no file), checked just before the
rename. A change whose file changed underneath is refused, never overwritten, and stays staged
(the human discards it, or the model stages it again over the new content).

- ``review``: per file. Each change is written or refused on its own.
- ``audit``: all or nothing. Every file is checked against its base first; if one changed, nothing
  is written. Then each is written with its compare-and-swap. What remains is the window between
  the check and the last rename: a process in the sandbox that changes a file of the batch in
  those milliseconds makes that file's write refused while the ones before it are already
  renamed. The sandbox offers no multi-file transaction, so the outcome then says exactly which
  were written and which were not (those stay staged).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.core.sandbox_api import FileOpError, Sandbox, SandboxError
from dispatcher.core.staging.area import ABSENT, READ_LIMIT, StagedChange, StagingArea

__all__ = ["ApplyOutcome", "Refusal", "apply", "discard"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A change that was not written, and why (it stays staged)."""

    change: StagedChange
    reason: str


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    applied: tuple[StagedChange, ...]
    refused: tuple[Refusal, ...]


async def apply(
    area: StagingArea, sandbox: Sandbox, change_ids: Sequence[str], *, all_or_nothing: bool
) -> ApplyOutcome:
    """Write the named changes (none named: all) to the disk; see the module docstring.

    Raises:
        UnknownStagedChangeError: an id names no staged change (nothing is written).
    """
    async with area.lock:
        changes = area.select(change_ids)
        if all_or_nothing:
            changed = await _changed_underneath(sandbox, changes)
            if changed:
                return ApplyOutcome((), tuple(_batch_refused(changes, changed)))
        applied: list[StagedChange] = []
        refused: list[Refusal] = []
        for i, change in enumerate(changes):
            problem = await _write(sandbox, change)
            if problem is None:
                applied.append(change)
                continue
            refused.append(Refusal(change, problem))
            if all_or_nothing:  # the residual window (module docstring): stop, say what was written
                done = ", ".join(c.change_id for c in applied) or "none"
                refused.extend(
                    Refusal(c, f"not written: the batch stopped at {change.change_id} ({done} written)")
                    for c in changes[i + 1 :]
                )
                break
        await area.remove(c.change_id for c in applied)
        return ApplyOutcome(tuple(applied), tuple(refused))


async def discard(area: StagingArea, change_ids: Sequence[str]) -> list[StagedChange]:
    """Drop the named changes (none named: all); nothing is written.

    Raises:
        UnknownStagedChangeError: an id names no staged change (nothing is dropped).
    """
    async with area.lock:
        changes = area.select(change_ids)
        await area.remove(c.change_id for c in changes)
        return changes


async def _write(sandbox: Sandbox, change: StagedChange) -> str | None:
    """Write one change over its base; None when written, else why not."""
    try:
        await sandbox.write_bytes(
            change.path, change.data, approved=change.path, expect_sha256=change.base_sha256
        )
    except FileOpError as exc:
        if exc.code == "changed":
            return _changed(change)
        return f"not written: {exc.message}"
    except SandboxError as exc:
        return f"not written: the sandbox failed ({exc}); it will be recreated, apply again"
    return None


async def _changed_underneath(sandbox: Sandbox, changes: Sequence[StagedChange]) -> dict[str, str]:
    """Change id -> why, for each change whose file is no longer its base (or cannot be read)."""
    found: dict[str, str] = {}
    for change in changes:
        try:
            data = await sandbox.read_bytes(change.path, max_bytes=READ_LIMIT + 1, approved=change.path)
            now = hashlib.sha256(data).hexdigest()
        except FileOpError as exc:
            if exc.code == "ENOENT":
                now = ABSENT
            elif exc.code == "changed":
                found[change.change_id] = _changed(change)
                continue
            else:
                found[change.change_id] = f"cannot check {change.path}: {exc.message}"
                continue
        except SandboxError as exc:
            found[change.change_id] = f"cannot check {change.path}: the sandbox failed ({exc})"
            continue
        if now != change.base_sha256:
            found[change.change_id] = _changed(change)
    return found


def _batch_refused(changes: Sequence[StagedChange], changed: dict[str, str]) -> list[Refusal]:
    named = ", ".join(changed)
    return [
        Refusal(
            c,
            changed.get(c.change_id)
            or f"not written: audit mode applies its changes as a whole, and {named} cannot be applied",
        )
        for c in changes
    ]


def _changed(change: StagedChange) -> str:
    what = "was created" if change.base_sha256 == ABSENT else "changed"
    return (
        f"{change.path} {what} on disk after the change was staged; not written, still staged: "
        "discard it, or have the model read the file and stage it again"
    )
