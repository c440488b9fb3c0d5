"""UploadFiles and DownloadFiles: proto <-> the core's tree transfers, and their status codes.

Status codes: INVALID_ARGUMENT for a malformed stream or an archive member that may not be
extracted (the message names it), RESOURCE_EXHAUSTED for a size limit or a full disk,
PERMISSION_DENIED outside the session's grants (or the workspace), NOT_FOUND for a missing path
(or session), FAILED_PRECONDITION when the workspace has a file where the archive has a directory
(or the reverse), UNAVAILABLE when the sandbox failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from dispatcher.core.errors import ToolPermissionDenied
from dispatcher.core.sandbox_api import FileOpError, SandboxError
from dispatcher.core.transfer import (
    TransferConflict,
    TransferRefused,
    TransferTooLarge,
    TreeTransfers,
    UploadSummary,
)
from dispatcher.server.requests.checks import MAX_ID_CHARS
from dispatcher.server.requests.errors import InvalidRequest, Unauthenticated, status_for
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.auth import current_tenant
from dispatcher.v1 import dispatcher_pb2 as pb

MAX_PATH_CHARS = 4096
DRAIN_BYTES = 64 << 20  # after a failed upload: how much more of the archive is read and dropped
DRAIN_SECONDS = 5.0

_STATUS: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (TransferRefused, grpc.StatusCode.INVALID_ARGUMENT),
    (TransferTooLarge, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (TransferConflict, grpc.StatusCode.FAILED_PRECONDITION),
    (ToolPermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (SandboxError, grpc.StatusCode.UNAVAILABLE),
)


def transfer_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status of a failed transfer; request-level errors as every RPC maps them."""
    if isinstance(exc, FileOpError):
        if exc.code == "ENOENT":
            return grpc.StatusCode.NOT_FOUND, str(exc)
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            return code, str(exc) or code.name.lower()
    return status_for(exc)


async def _drain(requests: AsyncIterator[pb.UploadFilesRequest]) -> None:
    """Read (and drop) what the client still sends, within bounds, before the status goes out.

    grpc.aio clients that are still writing when the server ends the call may see INTERNAL
    "Internal error from Core" instead of the status (grpc/grpc#36066); letting a small rest of
    the archive arrive first gives them the real one.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_SECONDS):
            drained = 0
            async for request in requests:
                drained += request.ByteSize()
                if drained > DRAIN_BYTES:
                    return


def _check_path(path: str) -> str:
    if len(path) > MAX_PATH_CHARS or "\x00" in path:
        raise InvalidRequest(f"path: at most {MAX_PATH_CHARS} characters and no NUL")
    return path or "."


class TransferHandlers:
    """The bodies of the two RPCs (the servicer delegates to these)."""

    def __init__(self, sessions: SessionManager, transfers: TreeTransfers) -> None:
        self._sessions = sessions
        self._transfers = transfers

    async def upload(
        self, requests: AsyncIterator[pb.UploadFilesRequest], context: grpc.aio.ServicerContext
    ) -> pb.UploadFilesResponse:
        try:
            summary = await self._upload(requests)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if not isinstance(exc, Unauthenticated):
                await _drain(requests)
            await context.abort(*transfer_status(exc))
            raise  # unreachable: abort raises
        return pb.UploadFilesResponse(
            files=summary.files, directories=summary.directories, bytes=summary.bytes
        )

    async def _upload(self, requests: AsyncIterator[pb.UploadFilesRequest]) -> UploadSummary:
        tenant = current_tenant()
        first = await anext(aiter(requests), None)
        if first is None or first.WhichOneof("payload") != "target":
            raise InvalidRequest("the first UploadFilesRequest must carry `target` (session_id and path)")
        if len(first.target.session_id) > MAX_ID_CHARS:
            raise InvalidRequest(f"target.session_id: at most {MAX_ID_CHARS} characters")
        entry = self._sessions.get(tenant, first.target.session_id)
        path = _check_path(first.target.path)

        async def chunks() -> AsyncIterator[bytes]:
            async for request in requests:
                if request.WhichOneof("payload") != "chunk":
                    raise InvalidRequest(
                        "only the first UploadFilesRequest carries `target`; later ones `chunk`"
                    )
                if request.chunk:
                    yield request.chunk

        async with self._sessions.transfer_slot(tenant, entry):
            return await self._transfers.upload(entry.session, path, chunks())

    async def download(
        self, request: pb.DownloadFilesRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DownloadFilesResponse]:
        try:
            tenant = current_tenant()
            entry = self._sessions.get(tenant, request.session_id)
            path = _check_path(request.path)
            async with (
                self._sessions.transfer_slot(tenant, entry),
                self._transfers.download(entry.session, path) as chunks,
            ):
                async for chunk in chunks:
                    yield pb.DownloadFilesResponse(chunk=chunk)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*transfer_status(exc))
