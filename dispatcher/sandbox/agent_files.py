"""``WorkspaceFileAPI`` over the in-container agent, written once for every agent-backed sandbox.

Each method is one agent request. How a request reaches a live channel differs per backend (the
local one starts its agent on demand; the Docker one holds the container busy, bounds the wait,
retries a request never delivered, and recreates a sandbox whose agent broke), so a subclass
supplies only ``_file_op``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from dispatcher.core.patch import apply_patch
from dispatcher.core.sandbox_api import DirListing, FileStat
from dispatcher.sandbox.channel import AgentChannel

T = TypeVar("T")

__all__ = ["AgentFiles"]


class AgentFiles:
    """The workspace file operations of a sandbox whose agent answers over an ``AgentChannel``."""

    async def _file_op(self, what: str, op: Callable[[AgentChannel], Awaitable[T]]) -> T:
        """Run ``op`` on the live channel; ``what`` names the operation in errors."""
        raise NotImplementedError

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes:
        """See ``WorkspaceFileAPI.read_bytes``."""
        return await self._file_op(
            "read", lambda ch: ch.read_bytes(path, max_bytes=max_bytes, approved=approved)
        )

    async def read(self, path: str) -> str:
        """See ``WorkspaceFileAPI.read``."""
        return await self._file_op("read", lambda ch: ch.read(path))

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """See ``WorkspaceFileAPI.write_bytes``."""
        await self._file_op(
            "write", lambda ch: ch.write_bytes(path, data, approved=approved, expect_sha256=expect_sha256)
        )

    async def write(
        self, path: str, content: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        """See ``WorkspaceFileAPI.write``."""
        await self._file_op(
            "write", lambda ch: ch.write(path, content, approved=approved, expect_sha256=expect_sha256)
        )

    async def append(self, path: str, content: str) -> None:
        """See ``WorkspaceFileAPI.append``."""
        await self._file_op("append", lambda ch: ch.append(path, content))

    async def exists(self, path: str) -> bool:
        """See ``WorkspaceFileAPI.exists``."""
        return await self._file_op("exists", lambda ch: ch.exists(path))

    async def stat(self, path: str, *, approved: str | None = None) -> FileStat:
        """See ``WorkspaceFileAPI.stat``."""
        return await self._file_op("stat", lambda ch: ch.stat(path, approved=approved))

    async def list(self, path: str, *, limit: int = 1000, approved: str | None = None) -> DirListing:
        """See ``WorkspaceFileAPI.list``."""
        return await self._file_op("list", lambda ch: ch.list(path, limit=limit, approved=approved))

    async def delete(self, path: str) -> None:
        """See ``WorkspaceFileAPI.delete``."""
        await self._file_op("delete", lambda ch: ch.delete(path))

    async def patch(
        self, path: str, old: str, new: str, *, approved: str | None = None, replace_all: bool = False
    ) -> int:
        """See ``WorkspaceFileAPI.patch``: a read and a write of the agent's, patched here."""
        return await apply_patch(self, path, old, new, approved=approved, replace_all=replace_all)

    async def resolve(self, path: str) -> str:
        """See ``WorkspaceFileAPI.resolve``."""
        return await self._file_op("resolve", lambda ch: ch.resolve(path))
