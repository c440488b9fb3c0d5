"""A session's staged changes (spec 004 review and audit modes): writes kept off the disk until a
human applies them.

In a ``review`` or ``audit`` session a write of a tool that previews its change (``Previewable``:
``write_file``, ``patch_file``, any tool offering ``preview``) does not touch the disk: the file it
would leave is kept here, one ``StagedChange`` per file, and the call returns at once
(``core/call/review.py``). Later reads and listings of the session see the staged content
(``core/staging/files.py``); ``shell`` sees the disk. A human lists, applies or discards the changes
(``core/staging/apply.py``): per file in review mode, all or nothing in audit mode.

A second staged write to a file already staged updates that change (same id, same base): the
change is always "the file as the session would leave it" over "the file as it was when first
staged". ``StagingArea`` is the one owner of a session's changes; whoever must keep them (the
server's state store) subscribes as its ``sink``.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from dispatcher.core.errors import UnknownStagedChangeError

__all__ = [
    "ABSENT",
    "NO_SINK",
    "READ_LIMIT",
    "ChangeKind",
    "StagedChange",
    "StagingArea",
    "StagingSink",
    "new_change_id",
]

READ_LIMIT = 8 << 20
"""Most bytes of a file on disk that staging reads (to diff against) and applying reads (to compare
with the base): a larger file cannot be staged."""

ABSENT = "absent"
"""The base of a change that creates its file: there was no file (``expect_sha256`` says the same)."""


class ChangeKind(StrEnum):
    """What a staged change does to its file."""

    CREATE = "create"  # there was no file when it was first staged
    MODIFY = "modify"  # it replaces the file's content


@dataclass(frozen=True, slots=True)
class StagedChange:
    """One file as the session would leave it, kept off the disk."""

    change_id: str
    path: str
    """Workspace-relative, as resolved in the sandbox when first staged; applied exactly there."""
    kind: ChangeKind
    base_sha256: str
    """sha256 of the file when first staged (``ABSENT``: none); it is applied only over that."""
    data: bytes
    """The file's whole new content."""
    diff: str
    """Unified diff from the base to ``data`` (bounded; ``core/call/review.py``)."""
    staged_at: float
    """Wall-clock seconds of the last staging that changed it."""
    tool_name: str
    tool_use_id: str
    """The call that staged it last."""

    @property
    def size(self) -> int:
        """What it costs the session's staging bound: its content and its diff."""
        return len(self.data) + len(self.diff.encode("utf-8", "surrogatepass"))


def new_change_id() -> str:
    """A fresh id (never reused: a human's "apply X" cannot reach a later change)."""
    return "stg_" + secrets.token_hex(5)


class StagingSink(Protocol):
    """Keeps a session's staged changes elsewhere (the state store), told before callers are."""

    async def change_staged(self, session_id: str, change: StagedChange) -> None:
        """``change`` was added or replaced the one with its id."""
        ...

    async def changes_removed(self, session_id: str, change_ids: Sequence[str]) -> None:
        """These changes were applied or discarded."""
        ...


class _NoSink:
    async def change_staged(self, session_id: str, change: StagedChange) -> None:
        pass

    async def changes_removed(self, session_id: str, change_ids: Sequence[str]) -> None:
        pass


NO_SINK: StagingSink = _NoSink()


class StagingArea:
    """One session's staged changes, in staging order. ``lock`` is held by whoever reads a change
    and writes it back (staging a call, applying, discarding), so each sees the others whole."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._changes: dict[str, StagedChange] = {}
        self.lock = asyncio.Lock()
        self.sink: StagingSink = NO_SINK

    def __len__(self) -> int:
        return len(self._changes)

    def __bool__(self) -> bool:
        return bool(self._changes)

    def changes(self) -> list[StagedChange]:
        """Every change, oldest first."""
        return list(self._changes.values())

    def by_path(self, path: str) -> StagedChange | None:
        """The change staged for ``path`` (workspace-relative, resolved), if any."""
        return next((c for c in self._changes.values() if c.path == path), None)

    def total_bytes(self) -> int:
        return sum(c.size for c in self._changes.values())

    def select(self, change_ids: Sequence[str]) -> list[StagedChange]:
        """The named changes in staging order (none named: all of them).

        Raises:
            UnknownStagedChangeError: an id names no change (nothing is selected).
        """
        if not change_ids:
            return self.changes()
        unknown = [i for i in change_ids if i not in self._changes]
        if unknown:
            raise UnknownStagedChangeError(
                f"no staged change {', '.join(map(repr, unknown))} in this session"
            )
        wanted = set(change_ids)
        return [c for c in self._changes.values() if c.change_id in wanted]

    async def put(self, change: StagedChange) -> None:
        """Add ``change`` (or replace the one with its id), kept by the sink first."""
        await self.sink.change_staged(self.session_id, change)
        self._changes[change.change_id] = change

    async def remove(self, change_ids: Iterable[str]) -> None:
        """Forget these changes (applied or discarded), in the sink first."""
        ids = [i for i in change_ids if i in self._changes]
        if not ids:
            return
        await self.sink.changes_removed(self.session_id, ids)
        for change_id in ids:
            del self._changes[change_id]

    def restore(self, changes: Iterable[StagedChange]) -> None:
        """Put back what a previous life of the session staged (already kept by the sink)."""
        for change in changes:
            self._changes[change.change_id] = change
