"""An in-memory sandbox for unit tests of the core: no processes, no containers, no disk.

Files live in a dict keyed by absolute path under ``/workspace``; ``exec`` runs a Python
callable the test supplies. File operations check paths lexically only; ``resolve`` also follows
the symlinks a test declares in ``links`` (workspace-relative link -> target, as ``ln -s`` stores it).
Given an ``approved`` path (what ``resolve`` said at confirmation), an operation uses it instead
of the path as written, and records it in ``approved``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import posixpath
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.paths import resolve_workspace_path
from dispatcher.core.sandbox_api import (
    AttachedProcess,
    DirEntry,
    DirListing,
    ExecRequest,
    ExecResult,
    FileOpError,
    FileStat,
    OutputCallback,
    SandboxError,
    SandboxProvider,
)
from dispatcher.core.session import Session

ExecHandler = Callable[[ExecRequest, OutputCallback, asyncio.Event], Awaitable[ExecResult]]


async def _default_exec(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
    on_output("stdout", request.command.encode())
    return ExecResult(exit_code=0)


@dataclass
class FakeSandbox:
    """Implements ``dispatcher.core.sandbox_api.Sandbox`` in memory."""

    files: dict[str, bytes] = field(default_factory=dict)
    exec_handler: ExecHandler = _default_exec
    calls: list[tuple[str, str]] = field(default_factory=list)
    root: str = "/workspace"
    links: dict[str, str] = field(default_factory=dict)
    approved: list[tuple[str, str]] = field(default_factory=list)  # (op, approved path) per use

    @property
    def workspace_root(self) -> str:
        return self.root

    def _path(self, op: str, path: str, approved: str | None = None) -> str:
        self.calls.append((op, path))
        if approved is None:
            return resolve_workspace_path(path, self.root)
        self.approved.append((op, approved))
        return self.root if approved == "." else f"{self.root}/{approved}"

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes:
        full = self._path("read", path, approved)
        if full not in self.files:
            raise FileOpError("ENOENT", f"No such file: {path!r}")
        data = self.files[full]
        return data if max_bytes is None else data[:max_bytes]

    async def read(self, path: str) -> str:
        return (await self.read_bytes(path)).decode()

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        full = self._path("write", path, approved)
        if expect_sha256 is not None:
            current = self.files.get(full)
            if (hashlib.sha256(current).hexdigest() if current is not None else "absent") != expect_sha256:
                raise FileOpError("changed", f"{path}: changed after it was reviewed; nothing was written")
        self.files[full] = data

    async def write(
        self, path: str, content: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        await self.write_bytes(path, content.encode(), approved=approved, expect_sha256=expect_sha256)

    async def append(self, path: str, content: str) -> None:
        full = self._path("append", path)
        self.files[full] = self.files.get(full, b"") + content.encode()

    async def exists(self, path: str) -> bool:
        return self._path("exists", path) in self.files

    async def stat(self, path: str, *, approved: str | None = None) -> FileStat:
        full = self._path("stat", path, approved)
        if full not in self.files:
            raise FileOpError("ENOENT", f"No such file: {path!r}")
        return FileStat(full, "file", len(self.files[full]), 0o644, 0.0)

    async def list(self, path: str, *, limit: int = 1000, approved: str | None = None) -> DirListing:
        prefix = self._path("list", path, approved).rstrip("/") + "/"
        names = sorted({p[len(prefix) :].split("/")[0] for p in self.files if p.startswith(prefix)})
        entries = tuple(DirEntry(n, "file") for n in names[:limit])
        return DirListing(entries, truncated=len(names) > limit)

    async def delete(self, path: str) -> None:
        self.files.pop(self._path("delete", path), None)

    async def resolve(self, path: str) -> str:
        pending = resolve_workspace_path(path, self.root)[len(self.root) :].strip("/").split("/")
        done: list[str] = []
        hops = 0
        while pending:
            part = pending.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if not done:
                    raise WorkspaceEscapeError(f"{path}: path escapes the workspace")
                done.pop()
                continue
            target = self.links.get("/".join([*done, part]))
            if target is None:
                done.append(part)
                continue
            hops += 1
            if hops > 40 or posixpath.isabs(target):
                raise WorkspaceEscapeError(f"{path}: path escapes the workspace")
            pending[:0] = target.split("/")
        self.calls.append(("resolve", path))
        return "/".join(done) or "."

    async def exec(
        self, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
    ) -> ExecResult:
        self.calls.append(("exec", request.command))
        return await self.exec_handler(request, on_output, cancel_event)

    async def start_process(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], *, limit: int
    ) -> AttachedProcess:
        """No processes here."""
        raise SandboxError("run: sandbox needs the docker or local sandbox backend, not FakeSandbox")

    @contextlib.asynccontextmanager
    async def agent_channel(self, what: str) -> AsyncIterator[Any]:
        """No agent here: no tree transfers."""
        raise SandboxError(f"{what}: this sandbox backend cannot transfer trees")
        yield  # pragma: no cover - a generator, for asynccontextmanager

    def quota_note(self) -> str | None:
        return None


class FakeSandboxProvider(SandboxProvider):
    """Hands out one FakeSandbox per session and records which sessions were closed."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.closed: list[str] = []
        self.aclosed = False

    def sandbox_for(self, session: Session) -> FakeSandbox:
        return self.sandboxes.setdefault(session.session_id, FakeSandbox())

    async def close_session(self, session_id: str) -> None:
        self.closed.append(session_id)
        self.sandboxes.pop(session_id, None)

    async def aclose(self) -> None:
        self.aclosed = True
