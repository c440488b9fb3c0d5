"""A background process's output: a bounded ring of stdout and stderr bytes on one cursor.

Every byte either stream ever wrote has one position: the cursor counts the bytes of both, in
the order the agent read them. The ring keeps the newest ``capacity`` bytes; a reader asking
from a position that fell out of it is told how many bytes it lost (never a silent gap). The
ring never refuses bytes: the process writing them is never slowed by a missing reader.

Not thread-safe: its owner (``table.py``) holds its lock around every call.
"""

from __future__ import annotations

from collections import deque

PIECE_OVERHEAD = 64
"""What one stored piece costs beyond its bytes, counted against the capacity: output that
switches streams on every byte cannot grow the ring's memory past its bound."""
JOIN_BELOW = 64 * 1024
"""A write continues the newest piece of the same stream while that stays below this size."""


class Ring:
    """The newest ``capacity`` bytes (pieces' overhead included) of a process's two streams."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(capacity, PIECE_OVERHEAD + 1)
        self._pieces: deque[tuple[str, int, bytearray]] = deque()  # (stream, cursor, bytes)
        self._used = 0  # bytes held plus each piece's overhead
        self.first = 0
        """The position of the oldest byte still held (== ``end`` when none is)."""
        self.end = 0
        """The position after the newest byte: the total both streams ever wrote."""

    @property
    def held(self) -> int:
        """Bytes of output held (without the pieces' overhead)."""
        return self.end - self.first

    def append(self, stream: str, data: bytes) -> None:
        """Add what ``stream`` wrote, dropping the oldest bytes beyond the capacity."""
        if not data:
            return
        room = self.capacity - PIECE_OVERHEAD
        if len(data) > room:  # only its tail can be kept; the rest is lost at once
            skipped = len(data) - room
            self.end += skipped
            data = data[skipped:]
            self._drop_all()
        last = self._pieces[-1] if self._pieces else None
        if last is not None and last[0] == stream and len(last[2]) + len(data) <= JOIN_BELOW:
            last[2].extend(data)
            self._used += len(data)
        else:
            self._pieces.append((stream, self.end, bytearray(data)))
            self._used += len(data) + PIECE_OVERHEAD
        self.end += len(data)
        self._trim()

    def _drop_all(self) -> None:
        self._pieces.clear()
        self._used = 0
        self.first = self.end

    def _trim(self) -> None:
        while self._used > self.capacity:
            stream, cursor, data = self._pieces[0]
            excess = self._used - self.capacity
            if excess >= len(data):  # the whole piece goes, its overhead with it
                self._pieces.popleft()
                self._used -= len(data) + PIECE_OVERHEAD
            else:  # cut the oldest piece's head
                del data[:excess]
                self._pieces[0] = (stream, cursor + excess, data)
                self._used -= excess
        self.first = self._pieces[0][1] if self._pieces else self.end

    def read(self, after: int, max_bytes: int) -> tuple[list[tuple[str, int, bytes]], int, int]:
        """(pieces as (stream, cursor, bytes), the next cursor, bytes lost) from position ``after``:
        at most ``max_bytes`` of output. ``lost`` counts the bytes between ``after`` and the first
        one returned that the ring no longer holds; an ``after`` past the end reads nothing."""
        after = min(max(after, 0), self.end)
        lost = max(self.first - after, 0)
        position = max(after, self.first)
        out: list[tuple[str, int, bytes]] = []
        budget = max_bytes
        for stream, cursor, data in self._pieces:
            if budget <= 0:
                break
            stop = cursor + len(data)
            if stop <= position:
                continue
            start = position - cursor
            piece = bytes(data[start : start + budget])
            out.append((stream, position, piece))
            position += len(piece)
            budget -= len(piece)
        return out, position, lost
