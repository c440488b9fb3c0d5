"""The running uploads and downloads of one channel (``untar_*`` and ``tar_*``)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from .protocol import (
    Done,
    DownloadStarted,
    Send,
    TarBegin,
    TarEnd,
    TarRead,
    UntarBegin,
    UntarChunk,
    UntarEnd,
    UntarResult,
    UploadStarted,
)
from .workspace import OpError, Workspace

if TYPE_CHECKING:
    # Imported when a tree transfer first starts: tarfile is ~0.7 MiB of every idle agent's memory.
    from .download import Download
    from .upload import Upload


class Transfers:
    """The running uploads and downloads, by the id of the request that began each."""

    def __init__(self, ws: Workspace, send: Send) -> None:
        self._ws = ws
        self._send = send
        self._lock = threading.Lock()
        self._uploads: dict[int, Upload] = {}
        self._downloads: dict[int, Download] = {}

    def untar_begin(self, rid: int, r: UntarBegin) -> UploadStarted:
        from .upload import Upload

        up = Upload(self._ws, self._send, r.path, r.max_files, r.max_bytes)
        with self._lock:
            self._uploads[rid] = up
        return UploadStarted(rid)

    def untar_chunk(self, rid: int, r: UntarChunk) -> None:
        """Queued for the extractor, which answers once it took it (never blocks)."""
        with self._lock:
            up = self._uploads.get(r.upload)
        if up is None:
            raise OpError("bad_request", f"no upload {r.upload}")
        up.chunk(rid, r.data)

    def untar_end(self, rid: int, r: UntarEnd) -> UntarResult:
        with self._lock:
            ending = self._uploads.pop(r.upload, None)
        if ending is None:
            raise OpError("bad_request", f"no upload {r.upload}")
        return ending.end(r.commit)

    def tar_begin(self, rid: int, r: TarBegin) -> DownloadStarted:
        from .download import Download

        down = Download(self._ws, self._send, r.path, r.max_bytes)
        with self._lock:
            self._downloads[rid] = down
        return DownloadStarted(rid)

    def tar_read(self, rid: int, r: TarRead) -> None:
        """Queued for the producer, which answers with the next chunk (never blocks)."""
        with self._lock:
            down = self._downloads.get(r.download)
        if down is None:
            raise OpError("bad_request", f"no download {r.download}")
        down.read(rid)

    def tar_end(self, rid: int, r: TarEnd) -> Done:
        with self._lock:
            down = self._downloads.pop(r.download, None)
        if down is not None:
            down.abort()
        return Done()
