"""The worker's stdout told apart: a cell's own output, and the worker's frames in it
(``MARKER + JSON + "\\n"``; ``python_worker.py``). Bytes in, bytes and frames out; bounded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_FRAME_BYTES = 16 << 20
"""Largest frame taken: a cell's figures (at most 8, base64) with its value's representations."""


class FrameError(Exception):
    """The worker sent something that is not a frame (it is not our worker, or it broke)."""


@dataclass(frozen=True, slots=True)
class Output:
    """Bytes the cell printed, as they came."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Frame:
    """One message of the worker."""

    message: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.message.get("type", ""))


class FrameReader:
    """Feed it the worker's stdout as it comes; it gives back output and frames in order. Output
    that could be the start of a marker is held until the next bytes tell."""

    def __init__(self, marker: str) -> None:
        self._marker = marker.encode()
        self._pending = bytearray()
        self._in_frame = False

    def feed(self, data: bytes) -> list[Output | Frame]:
        """What ``data`` completes.

        Raises:
            FrameError: a frame past ``MAX_FRAME_BYTES`` or not JSON.
        """
        self._pending += data
        items: list[Output | Frame] = []
        while True:
            if self._in_frame:
                end = self._pending.find(b"\n")
                if end < 0:
                    if len(self._pending) > MAX_FRAME_BYTES:
                        raise FrameError(f"a frame of the worker is longer than {MAX_FRAME_BYTES:,} bytes")
                    return items
                try:
                    message = json.loads(bytes(self._pending[:end]))
                except ValueError as exc:
                    raise FrameError(f"a frame of the worker is not JSON: {exc}") from None
                if not isinstance(message, dict):
                    raise FrameError("a frame of the worker is not a JSON object")
                items.append(Frame(message))
                del self._pending[: end + 1]
                self._in_frame = False
                continue
            start = self._pending.find(self._marker)
            if start >= 0:
                if start:
                    items.append(Output(bytes(self._pending[:start])))
                del self._pending[: start + len(self._marker)]
                self._in_frame = True
                continue
            keep = self._partial_marker()
            cut = len(self._pending) - keep
            if cut > 0:
                items.append(Output(bytes(self._pending[:cut])))
                del self._pending[:cut]
            return items

    def _partial_marker(self) -> int:
        """How many bytes at the end could begin the marker."""
        longest = min(len(self._pending), len(self._marker) - 1)
        for size in range(longest, 0, -1):
            if self._pending.endswith(self._marker[:size]):
                return size
        return 0

    def rest(self) -> bytes:
        """What is held at the end (the worker ended mid-way)."""
        return bytes(self._pending)
