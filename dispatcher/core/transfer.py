"""Trees in and out of a session's workspace (UploadFiles / DownloadFiles), as tar streams.

The archive is unpacked and packed where the files are, inside the sandbox, by the sandbox's
transport (``dispatcher.sandbox.transfer``); this module holds what does not depend on where:
the limits, the capability (grant) check, and the audit record.

Confirmation: a transfer is made by the client itself, not by the model, so the client is the
approver: no confirmation is asked, whatever the tool policy says about WRITE or READ tools. The
session's filesystem grants still apply (read-write on an upload's destination, read on what is
downloaded), checked here on the resolved path and again by the sandbox on what it opens, and
every transfer is audited like a tool call (tool ``UploadFiles`` / ``DownloadFiles``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dispatcher.core.audit import COMPLETED, DENIED, DISPATCHED, AuditDecision
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.errors import (
    DispatcherError,
    FailureReason,
    ToolError,
    ToolPermissionDenied,
    WorkspaceEscapeError,
)
from dispatcher.core.sandbox_api import FileOpError, Sandbox, SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import FsMode

if TYPE_CHECKING:
    from dispatcher.core.dispatcher import ToolDispatcher

UPLOAD_TOOL = "UploadFiles"
DOWNLOAD_TOOL = "DownloadFiles"


@dataclass(frozen=True, slots=True)
class TransferLimits:
    """Per-request bounds of a tree transfer (config ``server.max_upload_bytes`` and friends)."""

    max_upload_bytes: int = 1 << 30
    """Bytes of tar archive one UploadFiles may send (also bounds the files' content)."""
    max_upload_files: int = 100_000
    """Entries (files and directories) in one upload."""
    max_download_bytes: int = 1 << 30
    """Bytes of file content in one DownloadFiles."""


@dataclass(frozen=True, slots=True)
class UploadSummary:
    """What an upload wrote."""

    files: int
    directories: int
    bytes: int


class TransferError(DispatcherError):
    """A transfer the sandbox refused; ``code`` says why (see ``TransferRefused`` and friends)."""


class TransferRefused(TransferError, ValueError):
    """A member of the archive may not be extracted (a link, a device, '..', setuid, ...), or the
    archive is malformed; nothing was written."""


class TransferTooLarge(TransferError):
    """A size limit or the workspace's disk quota was reached; nothing was written."""


class TransferConflict(TransferError):
    """The workspace holds a file where the archive has a directory (or the reverse)."""


class TreeTransport(Protocol):
    """Moves tar streams in and out of a sandbox, unpacking and packing inside it."""

    async def upload(
        self, sandbox: Sandbox, path: str, chunks: AsyncIterable[bytes], limits: TransferLimits
    ) -> UploadSummary:
        """Unpack the archive into directory ``path`` (all or nothing).

        Raises:
            TransferRefused, TransferTooLarge, TransferConflict, ToolPermissionDenied, FileOpError,
            SandboxError.
        """
        ...

    def download(
        self, sandbox: Sandbox, path: str, limits: TransferLimits
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """The chunks of a tar of ``path``, produced as they are read."""
        ...


class TreeTransfers:
    """UploadFiles and DownloadFiles for the sessions of one dispatcher."""

    def __init__(
        self, dispatcher: ToolDispatcher, transport: TreeTransport, limits: TransferLimits | None = None
    ) -> None:
        self._dispatcher = dispatcher
        self._transport = transport
        self.limits = limits or TransferLimits()

    async def upload(self, session: Session, path: str, chunks: AsyncIterable[bytes]) -> UploadSummary:
        """Unpack a tar stream into ``path`` in the session's workspace; audited.

        Raises:
            ToolPermissionDenied: the destination is outside the session's write grants.
            TransferError: see the subclasses.
        """
        started = time.monotonic()
        audit: dict[str, Any] = {"input": {"path": path}}
        try:
            sandbox = self._dispatcher.sandbox_for(session)
            await self._check_grant(session, sandbox, path, "rw", audit)
            self._dispatched(session, UPLOAD_TOOL, audit)
            summary = await self._transport.upload(sandbox, path, chunks, self.limits)
        except BaseException as exc:
            self._audit(session, UPLOAD_TOOL, audit, started, exc)
            raise
        audit.update(files=summary.files, directories=summary.directories, bytes=summary.bytes)
        self._audit(session, UPLOAD_TOOL, audit, started, None)
        return summary

    @asynccontextmanager
    async def download(self, session: Session, path: str) -> AsyncIterator[AsyncIterator[bytes]]:
        """The chunks of a tar of ``path`` in the session's workspace; audited when done.

        Raises:
            ToolPermissionDenied: the path is outside the session's read grants.
            TransferError, FileOpError: the path is missing, or a limit was reached.
        """
        started = time.monotonic()
        audit: dict[str, Any] = {"input": {"path": path}, "bytes": 0}
        try:
            sandbox = self._dispatcher.sandbox_for(session)
            await self._check_grant(session, sandbox, path, "r", audit)
            self._dispatched(session, DOWNLOAD_TOOL, audit)
            async with self._transport.download(sandbox, path, self.limits) as chunks:
                yield _counted(chunks, audit)
        except BaseException as exc:
            self._audit(session, DOWNLOAD_TOOL, audit, started, exc)
            raise
        self._audit(session, DOWNLOAD_TOOL, audit, started, None)

    async def _check_grant(
        self, session: Session, sandbox: Sandbox, path: str, mode: FsMode, audit: dict[str, Any]
    ) -> None:
        """The capability check tools get before they run, on where ``path`` really is."""
        caps = session.capabilities
        if caps is None:
            return
        try:
            real = await sandbox.resolve(path or ".")
        except WorkspaceEscapeError:
            audit["decision"] = AuditDecision.WORKSPACE_ESCAPE
            raise
        except ToolPermissionDenied:
            audit["decision"] = AuditDecision.FS_DENIED
            raise
        if not _granted(caps, real, mode):
            audit["decision"] = AuditDecision.FS_DENIED
            verb = "write" if mode == "rw" else "read"
            raise ToolPermissionDenied(f"Path {path!r} is not granted for {verb} access in this session")

    def _dispatched(self, session: Session, tool: str, fields: dict[str, Any]) -> None:
        """The transfer is about to start: on record before it touches the workspace."""
        self._dispatcher.audit_record(
            DISPATCHED,
            tenant=session.tenant_id,
            session=session.session_id,
            tool=tool,
            decision=AuditDecision.CLIENT,  # the client asked for it: no confirmation
            input=fields["input"],
        )
        fields["dispatched"] = True

    def _audit(
        self, session: Session, tool: str, fields: dict[str, Any], started: float, exc: BaseException | None
    ) -> None:
        ran = fields.pop("dispatched", False)
        fields.setdefault("decision", AuditDecision.CLIENT)  # the client asked for it: no confirmation
        self._dispatcher.audit_record(
            COMPLETED if ran else DENIED,
            tenant=session.tenant_id,
            session=session.session_id,
            tool=tool,
            outcome=_outcome(exc),
            reason=_reason(exc),
            duration_ms=round((time.monotonic() - started) * 1000, 3),
            **fields,
        )


def _granted(caps: Capabilities, real: str, mode: FsMode) -> bool:
    return caps.check_fs(real, mode, relative=True)


async def _counted(chunks: AsyncIterator[bytes], audit: dict[str, Any]) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        audit["bytes"] += len(chunk)
        yield chunk


def _reason(exc: BaseException | None) -> str:
    """The final record's reason slug, as a call's (``FailureReason``; empty: it succeeded)."""
    if exc is None:
        return ""
    if isinstance(exc, ToolError):
        return exc.reason.value
    return FailureReason.TOOL_FAILED.value if isinstance(exc, Exception) else FailureReason.CANCELLED.value


def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "ok"
    if isinstance(exc, ToolError):
        return str(exc.error_class.value)
    if isinstance(exc, TransferError | FileOpError | SandboxError):
        return type(exc).__name__
    return "cancelled" if not isinstance(exc, Exception) else "error"
