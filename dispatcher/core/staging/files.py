"""The workspace as a session with staged changes sees it (``core/staging/area.py``): reads return the
staged content, listings show staged files, everything else goes to the sandbox unchanged.

The pipeline hands tools this view as ``ToolContext.workspace_files`` while the session has staged
changes; ``ToolContext.sandbox`` (what ``shell`` runs in) stays the sandbox itself, so commands see
the disk as it is. Paths are matched as the sandbox resolves them (``approved`` when the call was
resolved, else one ``resolve`` round trip): ``./a.txt``, ``/workspace/a.txt`` and a link to it
all reach the staged ``a.txt``. Only reads are overlaid: a write through this view (a tool that does
not preview, so is not staged) goes to the disk, and a change staged over that file is then refused
at apply, its base being gone.
"""

from __future__ import annotations

import posixpath

from dispatcher.core.sandbox_api import DirEntry, DirListing, FileOpError, FileStat, Sandbox
from dispatcher.core.staging.area import StagedChange, StagingArea

__all__ = ["StagedFiles"]


class StagedFiles:
    """A ``WorkspaceFileAPI``: ``sandbox`` with ``area``'s staged changes laid over its files."""

    def __init__(self, sandbox: Sandbox, area: StagingArea) -> None:
        self._sandbox = sandbox
        self._area = area

    @property
    def workspace_root(self) -> str:
        return self._sandbox.workspace_root

    async def _staged(self, path: str, approved: str | None) -> StagedChange | None:
        if not self._area:
            return None
        real = approved if approved is not None else await self._sandbox.resolve(path)
        return self._area.by_path(real)

    # -- overlaid reads ---------------------------------------------------------------------

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes:
        change = await self._staged(path, approved)
        if change is None:
            return await self._sandbox.read_bytes(path, max_bytes=max_bytes, approved=approved)
        return change.data if max_bytes is None else change.data[:max_bytes]

    async def read(self, path: str) -> str:
        change = await self._staged(path, None)
        if change is None:
            return await self._sandbox.read(path)
        try:
            return change.data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileOpError("decode", f"{path}: the staged content is not UTF-8 text") from None

    async def exists(self, path: str) -> bool:
        return await self._staged(path, None) is not None or await self._sandbox.exists(path)

    async def stat(self, path: str, *, approved: str | None = None) -> FileStat:
        change = await self._staged(path, approved)
        if change is None:
            return await self._sandbox.stat(path, approved=approved)
        full = posixpath.join(self.workspace_root, change.path)
        try:
            on_disk = await self._sandbox.stat(path, approved=change.path)
        except FileOpError:
            return FileStat(full, "file", len(change.data), 0o644, change.staged_at)
        return FileStat(on_disk.path, "file", len(change.data), on_disk.mode, change.staged_at)

    async def list(self, path: str, *, limit: int = 1000, approved: str | None = None) -> DirListing:
        if not self._area:
            return await self._sandbox.list(path, limit=limit, approved=approved)
        real = approved if approved is not None else await self._sandbox.resolve(path)
        below = self._below(real)
        try:
            listing = await self._sandbox.list(path, limit=limit, approved=approved)
        except FileOpError as exc:
            if exc.code != "ENOENT" or not below:
                raise
            listing = DirListing((), False)  # a directory only staged files are in
        if not below:
            return listing
        entries = {e.name: e for e in listing.entries}
        for name, change in below.items():
            if change is None:  # a directory a staged file would create
                entries.setdefault(name, DirEntry(name, "dir", staged=True))
            else:
                entries[name] = DirEntry(name, "file", len(change.data), staged=True)
        merged = sorted(entries.values(), key=lambda e: e.name)
        return DirListing(tuple(merged[:limit]), listing.truncated or len(merged) > limit)

    def _below(self, directory: str) -> dict[str, StagedChange | None]:
        """Names directly in ``directory`` that staged changes add: a file's change, or None for a
        directory on the way to a staged file."""
        prefix = "" if directory in (".", "") else directory.rstrip("/") + "/"
        found: dict[str, StagedChange | None] = {}
        for change in self._area.changes():
            if not change.path.startswith(prefix):
                continue
            first, sep, _ = change.path[len(prefix) :].partition("/")
            if sep:
                found.setdefault(first, None)
            else:
                found[first] = change
        return found

    # -- passed through ----------------------------------------------------------------------

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        await self._sandbox.write_bytes(path, data, approved=approved, expect_sha256=expect_sha256)

    async def write(
        self, path: str, content: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        await self._sandbox.write(path, content, approved=approved, expect_sha256=expect_sha256)

    async def append(self, path: str, content: str) -> None:
        await self._sandbox.append(path, content)

    async def delete(self, path: str) -> None:
        await self._sandbox.delete(path)

    async def patch(
        self, path: str, old: str, new: str, *, approved: str | None = None, replace_all: bool = False
    ) -> int:
        # A write, so it goes to the disk: it patches the file there, not a staged version of it.
        return await self._sandbox.patch(path, old, new, approved=approved, replace_all=replace_all)

    async def resolve(self, path: str) -> str:
        return await self._sandbox.resolve(path)
