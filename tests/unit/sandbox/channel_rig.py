"""A scripted agent on the other end of an ``AgentChannel``: the tests of the channel read what it
was sent and feed it frames (``channel`` and ``fake`` are fixtures of ``conftest.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.sandbox.agent.protocol import decode_header, decode_prefix, encode_frame

WAIT = 2.0


class FakeAgent:
    """The writer the channel talks to, plus a reader the test feeds answers into."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader()
        self.requests: asyncio.Queue[tuple[dict[str, Any], bytes]] = asyncio.Queue()
        self.closed = False
        self.writes = 0
        self._stream = bytearray()  # written, not yet a whole frame (a large payload is a write of its own)

    def write(self, data: bytes) -> None:
        self.writes += 1
        self._stream += data
        while len(self._stream) >= 8:
            header_len, payload_len = decode_prefix(
                bytes(self._stream[:8]), max_header=1 << 20, max_payload=1 << 30
            )
            end = 8 + header_len + payload_len
            if len(self._stream) < end:
                return
            header = decode_header(bytes(self._stream[8 : 8 + header_len]))
            self.requests.put_nowait((header, bytes(self._stream[8 + header_len : end])))
            del self._stream[:end]

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True

    async def request(self) -> dict[str, Any]:
        header, _ = await asyncio.wait_for(self.requests.get(), WAIT)
        return header

    def reply(self, header: dict[str, Any], payload: bytes = b"") -> None:
        self.reader.feed_data(encode_frame(header, payload))
