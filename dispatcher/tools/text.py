"""Bounded handling of command output: a head+tail byte buffer and a coalescing delta emitter."""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Callable


def _trim_partial_utf8(data: bytes) -> str:
    """Decode, dropping a multi-byte character cut off at the end."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=False)


def _skip_continuation(data: bytes) -> bytes:
    """Drop UTF-8 continuation bytes at the start (a character cut off at the front)."""
    start = 0
    while start < min(len(data), 3) and 0x80 <= data[start] <= 0xBF:
        start += 1
    return data[start:]


class HeadTailBuffer:
    """Keeps the first ``head`` and the last ``tail`` bytes of a stream and counts the rest.

    Memory stays at ``head + tail + one chunk`` whatever the stream's length.
    """

    def __init__(self, head: int, tail: int) -> None:
        self._head_limit = head
        self._tail_limit = tail
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        """Account for one more chunk."""
        self.total += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data or self._tail_limit <= 0:
            return
        if len(data) >= self._tail_limit:
            self._tail[:] = data[-self._tail_limit :]
            return
        self._tail += data
        excess = len(self._tail) - self._tail_limit
        if excess > 0:
            del self._tail[:excess]

    @property
    def omitted(self) -> int:
        """Bytes seen but no longer kept."""
        return self.total - len(self._head) - len(self._tail)

    def parts(self) -> tuple[str, str]:
        """Head and tail as two texts; when nothing was cut between them, all of it as the head
        and an empty tail."""
        if not self.omitted:
            return self.text(), ""
        head = _trim_partial_utf8(bytes(self._head))
        return head, _skip_continuation(bytes(self._tail)).decode("utf-8", errors="replace")

    def text(self) -> str:
        """Head and tail as text, with a marker saying how many bytes were cut between them."""
        if not self.omitted:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", errors="replace")
        head = _trim_partial_utf8(bytes(self._head))
        tail = _skip_continuation(bytes(self._tail)).decode("utf-8", errors="replace")
        marker = f"\n\n[... {self.omitted:,} bytes of output omitted ...]\n\n"
        return head + marker + tail


class CommandOutput:
    """A command's output as the model reads it, interleaved (``combined``), and what a caller
    needs of its streams apart: each one's size, and the head and tail of stderr (spec 001's
    ``CommandResult``). Bounded like ``combined``: ``stderr_head + stderr_tail`` more bytes."""

    def __init__(self, head: int, tail: int, *, stderr_head: int = 1024, stderr_tail: int = 1024) -> None:
        self.combined = HeadTailBuffer(head, tail)
        self.stderr = HeadTailBuffer(stderr_head, stderr_tail)
        self.stdout_bytes = 0

    def feed(self, stream: str, data: bytes) -> None:
        self.combined.feed(data)
        if stream == "stderr":
            self.stderr.feed(data)
        else:
            self.stdout_bytes += len(data)

    def metadata(self) -> dict[str, object]:
        """``stdout_bytes``, ``stderr_bytes``, and with any stderr its ``stderr_head`` and
        ``stderr_tail`` (the tail empty when the head holds it all)."""
        shown: dict[str, object] = {"stdout_bytes": self.stdout_bytes, "stderr_bytes": self.stderr.total}
        if self.stderr.total:
            head, tail = self.stderr.parts()
            shown["stderr_head"] = head
            shown["stderr_tail"] = tail
        return shown


class DeltaEmitter:
    """Turns raw output chunks into few, bounded ``emit(stream, text)`` calls.

    Output is held until ``min_bytes`` are pending or ``interval`` seconds passed, so a chatty
    command produces at most a few events per interval, each of at most ``max_bytes``. Deltas flow
    for the whole run, however long: a watcher that cannot keep up misses some (marked), the
    Dispatch's caller does not: ``feed`` then hands back a future to wait on before feeding more
    (``core/events/bus.py``), and the result keeps its own head and tail.
    """

    def __init__(
        self,
        emit: Callable[[str, str], asyncio.Future[None] | None],
        *,
        min_bytes: int = 4096,
        interval: float = 0.05,
        max_bytes: int = 64 << 10,
    ) -> None:
        self._emit = emit
        self._min_bytes = min_bytes
        self._interval = interval
        self._max_bytes = max_bytes
        self._pending: dict[str, bytearray] = {}
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.sent = 0

    def feed(self, stream: str, data: bytes) -> asyncio.Future[None] | None:
        """Queue a chunk; flushes when enough is pending, else arms the timer. A future back: wait
        for it before feeding more (the reader of the deltas is full; see ``OutputSink``)."""
        pending = self._pending.setdefault(stream, bytearray())
        pending += data
        if sum(len(p) for p in self._pending.values()) >= self._min_bytes:
            return self.flush()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self.flush)
        return None

    def flush(self) -> asyncio.Future[None] | None:
        """Emit everything pending, in deltas of at most ``max_bytes``; what the last emit said."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        room = None
        for stream, pending in self._pending.items():
            decoder = self._decoder(stream)
            for start in range(0, len(pending), self._max_bytes):
                chunk = bytes(pending[start : start + self._max_bytes])
                self.sent += len(chunk)
                text = decoder.decode(chunk)
                if text:
                    room = self._emit(stream, text)
            pending.clear()
        return room

    def close(self) -> None:
        """Flush what is left, including a character cut at the very end."""
        self.flush()
        for stream, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            if text:
                self._emit(stream, text)

    def _decoder(self, stream: str) -> codecs.IncrementalDecoder:
        decoder = self._decoders.get(stream)
        if decoder is None:
            decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return decoder
