"""Tree transfers over the agent channel: tar streams unpacked and packed inside the sandbox.

Upload: ``untar_begin``, then each chunk as ``untar_chunk`` (at most ``WINDOW`` unanswered, so
the server holds a few chunks at most however fast the client sends), then ``untar_end``, which
moves the files into place only if the whole archive passed. Download: ``tar_begin``, then one
``tar_read`` per chunk (``WINDOW`` ahead), ``tar_end`` always. The agent's answers are untrusted
like every other: sizes bounded by the channel, fields type-checked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable
from typing import Any

from dispatcher.core.sandbox_api import FileOpError, Sandbox
from dispatcher.core.transfer import (
    TransferConflict,
    TransferLimits,
    TransferRefused,
    TransferTooLarge,
    UploadSummary,
)
from dispatcher.sandbox.agent.protocol import (
    TarBegin,
    TarChunk,
    TarEnd,
    TarRead,
    UntarBegin,
    UntarChunk,
    UntarEnd,
)
from dispatcher.sandbox.channel import AgentChannel

WINDOW = 4  # chunks in flight towards (upload) or from (download) the agent
PIECE = 1 << 20  # an upload chunk bigger than this is sent to the agent in pieces
_TOO_LARGE = frozenset({"too_large", "ENOSPC", "EDQUOT", "EFBIG"})


class AgentTreeTransport:
    """``dispatcher.core.transfer.TreeTransport`` for sandboxes run by the in-sandbox agent."""

    async def upload(
        self, sandbox: Sandbox, path: str, chunks: AsyncIterable[bytes], limits: TransferLimits
    ) -> UploadSummary:
        """Unpack ``chunks`` (a tar stream) into directory ``path``; nothing is written on failure."""
        async with _channel(sandbox, "upload") as channel:
            try:
                return await _upload(channel, path or ".", chunks, limits)
            except FileOpError as exc:
                raise _transfer_error(exc, sandbox) from None

    @contextlib.asynccontextmanager
    async def download(
        self, sandbox: Sandbox, path: str, limits: TransferLimits
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """The chunks of a tar of ``path``, read from the agent as the consumer asks for them."""
        async with _channel(sandbox, "download") as channel:
            try:
                started = await channel.call(TarBegin(path or ".", limits.max_download_bytes))
            except FileOpError as exc:
                raise _transfer_error(exc, sandbox) from None
            download_id = started.download
            reads: list[asyncio.Future[TarChunk]] = []
            try:
                yield _download_chunks(channel, download_id, reads, sandbox, limits)
            finally:
                for read in reads:
                    read.cancel()
                if not channel.broken:
                    with contextlib.suppress(Exception):
                        await channel.call(TarEnd(download_id))


@contextlib.asynccontextmanager
async def _channel(sandbox: Sandbox, what: str) -> AsyncIterator[AgentChannel]:
    """The agent channel the sandbox lends (``Sandbox.agent_channel``), as the type it is."""
    async with sandbox.agent_channel(what) as channel:
        lent: AgentChannel = channel
        yield lent


async def _upload(
    channel: AgentChannel, path: str, chunks: AsyncIterable[bytes], limits: TransferLimits
) -> UploadSummary:
    # Shielded: a cancel that lands after the agent made the staging directory but before its answer
    # came back must still end that upload (else the staging stays in the workspace).
    begin = asyncio.ensure_future(
        channel.call(UntarBegin(path, limits.max_upload_files, limits.max_upload_bytes))
    )
    inflight: set[asyncio.Future[Any]] = set()
    try:
        upload_id = (await asyncio.shield(begin)).upload
        sent = 0
        async for chunk in chunks:
            sent += len(chunk)
            if sent > limits.max_upload_bytes:
                raise TransferTooLarge(
                    f"the archive passes {limits.max_upload_bytes} bytes (server.max_upload_bytes)"
                )
            for start in range(0, len(chunk), PIECE):
                while len(inflight) >= WINDOW:
                    done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                    _raise_first(done)  # the upload's error, as soon as the agent has one
                piece = chunk[start : start + PIECE]
                inflight.add(asyncio.ensure_future(_chunk(channel, upload_id, piece)))
        done, inflight = await asyncio.wait(inflight) if inflight else (set(), set())
        _raise_first(done)
    except BaseException:
        # Its own task, shielded: a second cancel cannot stop the agent from dropping the staging.
        await asyncio.shield(asyncio.ensure_future(_abandon(channel, begin, inflight)))
        raise
    moved = await channel.call(UntarEnd(upload_id, commit=True))
    return UploadSummary(files=moved.files, directories=moved.directories, bytes=moved.bytes)


async def _abandon(
    channel: AgentChannel, begin: asyncio.Future[Any], inflight: set[asyncio.Future[Any]]
) -> None:
    """End an upload the agent may have begun, writing nothing: its answers first, then untar_end."""
    try:
        started = await begin
    except BaseException:  # it never began (refused, or the channel broke): nothing to end
        return
    # The agent answers every chunk, even after a failure; collect them before ending.
    await asyncio.gather(*inflight, return_exceptions=True)
    with contextlib.suppress(Exception):
        await channel.call(UntarEnd(started.upload, commit=False))


def _raise_first(done: set[asyncio.Future[Any]]) -> None:
    """Raise the first error among finished chunk answers, having looked at every one."""
    errors = [task.exception() for task in done]
    for error in errors:
        if error is not None:
            raise error


def _chunk(channel: AgentChannel, upload_id: int, piece: bytes) -> Awaitable[Any]:
    return channel.call(UntarChunk(upload_id, piece))


async def _download_chunks(
    channel: AgentChannel,
    download_id: int,
    reads: list[asyncio.Future[TarChunk]],
    sandbox: Sandbox,
    limits: TransferLimits,
) -> AsyncIterator[bytes]:
    def ask() -> None:
        reads.append(asyncio.ensure_future(channel.call(TarRead(download_id))))

    for _ in range(WINDOW):
        ask()
    # The agent counts file content against the limit; this bounds what an agent that lies may
    # send (headers of 100,000 files fit the slack).
    budget = limits.max_download_bytes + limits.max_download_bytes // 8 + (64 << 20)
    while reads:
        try:
            chunk = await reads.pop(0)
        except FileOpError as exc:
            raise _transfer_error(exc, sandbox) from None
        if chunk.eof:
            return
        body = chunk.data
        budget -= len(body)
        if budget < 0:
            raise channel.violation("the download passes what max_download_bytes allows")
        ask()
        for start in range(0, len(body), PIECE):  # gRPC messages stay small whatever the agent sends
            yield body[start : start + PIECE]


def _transfer_error(exc: FileOpError, sandbox: Sandbox) -> Exception:
    """The core's view of an agent error answer about a transfer."""
    message = str(exc)
    if exc.code in ("refused", "bad_archive"):
        return TransferRefused(message)
    if exc.code in _TOO_LARGE:
        note = sandbox.quota_note() if exc.code != "too_large" else None
        return TransferTooLarge(f"{message}: {note}" if note else message)
    if exc.code == "conflict":
        return TransferConflict(message)
    return exc
