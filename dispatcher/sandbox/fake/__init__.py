"""An in-memory sandbox for unit tests of the core: no processes, no containers, no disk.

Files live in a dict keyed by absolute path under ``/workspace``; directories are those a file
or link lies under, plus those a write made (``dirs``); ``exec`` runs a Python callable the test
supplies (it may report ``left`` and ``shell_state``; ``table.adopt`` makes what it "left" a
process). Background processes live in ``table`` (``processes.py``), driven by the test; closing
the session kills them. Symbolic links are the ones a test declares in ``links`` (workspace-relative link ->
target, as ``ln -s`` stores it); every operation follows them as the agent does, and a path that
lands outside the workspace is ``WorkspaceEscapeError``. Given an ``approved`` path (what
``resolve`` said at confirmation), an operation uses it instead of the path as written, records it
in ``approved``, and fails with ``changed`` if a link stands on it now.

The answers (error codes included) are the real agent's: ``tests/contract`` runs the same tests
against this and every real sandbox.
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
from dispatcher.core.patch import apply_patch
from dispatcher.core.paths import resolve_workspace_path
from dispatcher.core.process_api import ProcessControl, ProcessError
from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.sandbox_api import (
    AttachedProcess,
    DirEntry,
    DirListing,
    EntryKind,
    ExecRequest,
    ExecResult,
    FileOpError,
    FileStat,
    OutputCallback,
    PortError,
    PortStream,
    SandboxError,
    check_port,
)
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.fake.processes import FakeProcesses

ExecHandler = Callable[[ExecRequest, OutputCallback, asyncio.Event], Awaitable[ExecResult]]
MAX_LINK_HOPS = 40  # as the kernel's ELOOP


async def _default_exec(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
    on_output("stdout", request.command.encode())
    return ExecResult(exit_code=0)


def _encode(path: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FileOpError("decode", f"{path}: text cannot be encoded as UTF-8") from None


@dataclass
class FakeSandbox:
    """Implements ``dispatcher.core.sandbox_api.Sandbox`` in memory."""

    files: dict[str, bytes] = field(default_factory=dict)
    exec_handler: ExecHandler = _default_exec
    calls: list[tuple[str, str]] = field(default_factory=list)
    root: str = "/workspace"
    links: dict[str, str] = field(default_factory=dict)
    approved: list[tuple[str, str]] = field(default_factory=list)  # (op, approved path) per use
    dirs: set[str] = field(default_factory=set)
    """Absolute paths of directories made by writes (they outlive the files deleted from them)."""
    table: FakeProcesses = field(default_factory=FakeProcesses)
    """Its background processes (``processes()``)."""
    has_processes: bool = True
    """False: ``processes()`` says ``unsupported``, as a backend without a table does."""
    execs: list[ExecRequest] = field(default_factory=list)
    """Every exec request, in order (cwd, env, ``leave_as``, ``capture_state`` as sent)."""

    def __post_init__(self) -> None:
        self.table.check_cwd = self._check_cwd

    @property
    def workspace_root(self) -> str:
        return self.root

    def _check_cwd(self, cwd: str) -> None:
        """A command's directory, as the agent checks it: inside the workspace, and there."""
        full = self._full(self._walk(cwd))
        if full in self.files:
            raise FileOpError("ENOTDIR", f"{cwd}: not a directory")
        if not self._is_dir(full):
            raise FileOpError("ENOENT", f"{cwd}: no such directory")

    # -- paths ----------------------------------------------------------------------------

    def _full(self, rel: str) -> str:
        return self.root if rel == "." else f"{self.root}/{rel}"

    def _walk(self, path: str, *, follow_last: bool = True) -> str:
        """``path`` relative to the root, links followed (the last one only if ``follow_last``).

        Raises:
            WorkspaceEscapeError: it lands outside the workspace (or holds NUL, or is too long).
        """
        lexical = resolve_workspace_path(path, self.root)  # NUL, length, absolute paths outside
        rel_path = lexical[len(self.root) :] if posixpath.isabs(path) else path
        pending = rel_path.split("/")
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
            if target is None or (not pending and not follow_last):
                done.append(part)
                continue
            hops += 1
            if hops > MAX_LINK_HOPS:
                raise WorkspaceEscapeError(f"{path}: too many levels of symbolic links")
            if posixpath.isabs(target):
                if target != self.root and not target.startswith(self.root + "/"):
                    raise WorkspaceEscapeError(f"{path}: path escapes the workspace")
                done, target = [], target[len(self.root) :]
            pending[:0] = target.split("/")
        return "/".join(done) or "."

    def _path(self, op: str, path: str, approved: str | None = None, *, follow_last: bool = True) -> str:
        self.calls.append((op, path))
        if approved is None:
            return self._full(self._walk(path, follow_last=follow_last))
        self.approved.append((op, approved))
        self._unchanged(path, approved)
        return self._full(approved)

    def _unchanged(self, path: str, approved: str) -> None:
        """The agent walks an approved path without following links: one standing on it now is
        ``changed``."""
        parts = [] if approved == "." else approved.split("/")
        if any("/".join(parts[: i + 1]) in self.links for i in range(len(parts))):
            raise FileOpError("changed", f"{path}: changed since it was approved (a link stands on it)")

    def _is_dir(self, full: str) -> bool:
        if full == self.root or full in self.dirs:
            return True
        prefix = full + "/"
        return any(p.startswith(prefix) for p in self.files) or any(
            self._full(link).startswith(prefix) for link in self.links
        )

    def _check_parents(self, path: str, full: str) -> None:
        """ENOTDIR if a file stands where a parent directory of ``full`` should be."""
        parent = posixpath.dirname(full)
        while parent != self.root and len(parent) > len(self.root):
            if parent in self.files:
                raise FileOpError("ENOTDIR", f"{path}: a parent is not a directory")
            parent = posixpath.dirname(parent)

    def _make_parents(self, full: str) -> None:
        parent = posixpath.dirname(full)
        while parent != self.root and len(parent) > len(self.root):
            self.dirs.add(parent)
            parent = posixpath.dirname(parent)

    def _writable(self, path: str, full: str) -> None:
        if self._is_dir(full):
            raise FileOpError("EISDIR", f"{path}: is a directory")
        self._check_parents(path, full)

    # -- the file API ---------------------------------------------------------------------

    async def read_bytes(
        self, path: str, *, max_bytes: int | None = None, approved: str | None = None
    ) -> bytes:
        full = self._path("read", path, approved)
        if full not in self.files:
            if self._is_dir(full):
                raise FileOpError("EISDIR", f"{path}: is a directory")
            raise FileOpError("ENOENT", f"No such file: {path!r}")
        data = self.files[full]
        return data if max_bytes is None else data[:max_bytes]

    async def read(self, path: str) -> str:
        try:
            return (await self.read_bytes(path)).decode()
        except UnicodeDecodeError:
            raise FileOpError("decode", f"{path}: not valid UTF-8 text") from None

    async def write_bytes(
        self, path: str, data: bytes, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        full = self._path("write", path, approved)
        self._writable(path, full)
        if expect_sha256 is not None:
            current = self.files.get(full)
            if (hashlib.sha256(current).hexdigest() if current is not None else "absent") != expect_sha256:
                raise FileOpError("changed", f"{path}: changed after it was reviewed; nothing was written")
        self._make_parents(full)
        self.files[full] = data

    async def write(
        self, path: str, content: str, *, approved: str | None = None, expect_sha256: str | None = None
    ) -> None:
        await self.write_bytes(path, _encode(path, content), approved=approved, expect_sha256=expect_sha256)

    async def append(self, path: str, content: str) -> None:
        data = _encode(path, content)
        full = self._path("append", path)
        self._writable(path, full)
        self._make_parents(full)
        self.files[full] = self.files.get(full, b"") + data

    async def exists(self, path: str) -> bool:
        full = self._path("exists", path)
        return full in self.files or self._is_dir(full)

    async def stat(self, path: str, *, approved: str | None = None) -> FileStat:
        full = self._path("stat", path, approved)
        if full in self.files:
            return FileStat(full, "file", len(self.files[full]), 0o644, 0.0)
        if self._is_dir(full):
            return FileStat(full, "dir", 0, 0o755, 0.0)
        raise FileOpError("ENOENT", f"No such file: {path!r}")

    async def list(self, path: str, *, limit: int = 1000, approved: str | None = None) -> DirListing:
        full = self._path("list", path, approved)
        if full in self.files:
            raise FileOpError("ENOTDIR", f"{path}: not a directory")
        if not self._is_dir(full):
            raise FileOpError("ENOENT", f"No such directory: {path!r}")
        prefix = full.rstrip("/") + "/"
        found: dict[str, DirEntry] = {}
        for p in [*self.files, *self.dirs]:
            if p.startswith(prefix):
                name = p[len(prefix) :].split("/")[0]
                kind: EntryKind = "file" if p == prefix + name and p in self.files else "dir"
                found[name] = DirEntry(name, kind, len(self.files[p]) if kind == "file" else 0)
        for link, target in self.links.items():
            linked = self._full(link)
            if posixpath.dirname(linked) == prefix.rstrip("/"):
                name = posixpath.basename(linked)
                found[name] = DirEntry(name, "symlink", len(target), target)
        names = sorted(found)
        return DirListing(tuple(found[n] for n in names[:limit]), truncated=len(names) > limit)

    async def delete(self, path: str) -> None:
        if "\x00" not in path:
            joined = (path if posixpath.isabs(path) else f"{self.root}/{path}").rstrip("/")
            if posixpath.basename(joined) in ("", ".", ".."):
                self.calls.append(("delete", path))
                raise FileOpError("EINVAL", f"{path}: refusing to delete this path")
        full = self._path("delete", path, follow_last=False)
        rel = full[len(self.root) + 1 :]
        if rel in self.links:
            del self.links[rel]
        elif full in self.files:
            del self.files[full]
        elif self._is_dir(full):
            prefix = full + "/"
            if any(p.startswith(prefix) for p in [*self.files, *self.dirs]) or any(
                self._full(link).startswith(prefix) for link in self.links
            ):
                raise FileOpError("ENOTEMPTY", f"{path}: directory not empty")
            self.dirs.discard(full)
        else:
            raise FileOpError("ENOENT", f"No such file: {path!r}")

    async def patch(
        self, path: str, old: str, new: str, *, approved: str | None = None, replace_all: bool = False
    ) -> int:
        return await apply_patch(self, path, old, new, approved=approved, replace_all=replace_all)

    async def resolve(self, path: str) -> str:
        rel = self._walk(path)
        self.calls.append(("resolve", path))
        return rel

    async def exec(
        self, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
    ) -> ExecResult:
        """The test's handler, after the checks the agent makes first: the cwd is a directory
        inside the workspace (an approved one has no link on it), and a call cancelled already
        runs nothing."""
        self.calls.append(("exec", request.command))
        self.execs.append(request)
        if request.approved_cwd is not None:
            self._unchanged(request.cwd, request.approved_cwd)
        else:
            self._check_cwd(request.cwd)
        if cancel_event.is_set():
            return ExecResult(exit_code=None, cancelled=True)
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

    async def connect_port(self, port: int) -> PortStream:
        """No agent here: nothing to connect to."""
        check_port(port)
        raise PortError("unsupported", "this sandbox (FakeSandbox) has no agent to reach its ports through")

    def processes(self) -> ProcessControl:
        if not self.has_processes:
            raise ProcessError("unsupported", "this sandbox has no process table")
        return self.table


class FakeSandboxProvider(SandboxProvider):
    """Hands out one FakeSandbox per session and records which sessions were closed."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.closed: list[str] = []
        self.aclosed = False

    def sandbox_for(self, session: Session) -> FakeSandbox:
        return self.sandboxes.setdefault(session.session_id, FakeSandbox())

    async def close_session(self, session_id: str) -> None:
        """Its processes are killed (the container goes with them) and its sandbox forgotten."""
        self.closed.append(session_id)
        sandbox = self.sandboxes.pop(session_id, None)
        if sandbox is not None:
            await sandbox.table.kill_all()

    async def aclose(self) -> None:
        self.aclosed = True
