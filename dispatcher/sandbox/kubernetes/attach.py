"""The ``pods/attach`` WebSocket as the agent's byte stream: an asyncio reader and a frame writer.

The channel protocols (``v4.channel.k8s.io``, ``v5.channel.k8s.io``): every binary message is one
channel byte then data; 0 stdin (ours), 1 stdout (the agent's frames: the reader), 2 stderr (a
bounded tail kept for diagnostics), 3 error (a JSON ``Status`` when the process's streams end).
v5's 255 "close" is never sent: half-closing stdin would end the agent, and the Pod must outlive a
server restart so it can be re-adopted (stdin stays open: ``stdinOnce: false``).

What the agent sends is untrusted and parsed by the agent link; the channel bytes come from the API
server. Writes are queued and sent in order by one task (``drain`` waits for the queue to empty),
so the link can post a signal without awaiting, as it does on a Docker stream. Reading has no
back-pressure of its own: the agent link consumes frames as they come (each bounded by the
protocol's frame limit), so what waits here is at most what the link has not parsed yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque

import aiohttp

log = logging.getLogger(__name__)

STDIN, STDOUT, STDERR, ERROR = 0, 1, 2, 3
CHUNK = 256 << 10
"""Largest stdin message: the agent's frames (up to 32 MiB) are split into messages this size."""
STDERR_TAIL_BYTES = 64 << 10
READER_LIMIT = 1 << 20


class ChannelStream:
    """One attached Pod process: ``reader`` is its stdout, ``writer`` (this) its stdin."""

    def __init__(
        self, ws: aiohttp.ClientWebSocketResponse, protocol: str, pod: str, *, limit: int = READER_LIMIT
    ) -> None:
        self.pod = pod
        self.protocol = protocol
        self.reader = asyncio.StreamReader(limit=limit)
        self.writer = self
        self.status: dict[str, object] | None = None
        """The error channel's ``Status`` once the stream ended (why, from the API server)."""
        self._ws = ws
        self._stderr: deque[bytes] = deque()
        self._stderr_size = 0
        self._outbox: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._flushed = asyncio.Event()
        self._flushed.set()
        self._failure: BaseException | None = None
        self._closing = False
        loop = asyncio.get_running_loop()
        self._receiver = loop.create_task(self._receive(), name=f"attach-recv-{pod}")
        self._sender = loop.create_task(self._send(), name=f"attach-send-{pod}")

    # -- FrameWriter ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing or self._failure is not None:
            raise ConnectionResetError(f"the attach stream of pod {self.pod} is closed")
        view = memoryview(data)
        for start in range(0, len(view), CHUNK):
            self._outbox.append(bytes([STDIN]) + view[start : start + CHUNK])
        self._flushed.clear()
        self._wake.set()

    async def drain(self) -> None:
        await self._flushed.wait()
        if self._failure is not None:
            raise ConnectionResetError(f"writing to pod {self.pod} failed: {self._failure}")

    def close(self) -> None:
        """Let go of the process without ending it (the WebSocket closes; stdin stays open)."""
        if self._closing:
            return
        self._closing = True
        self._sender.cancel()
        self._receiver.cancel()
        task = asyncio.get_running_loop().create_task(self._ws.close(), name=f"attach-close-{self.pod}")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self.reader.feed_eof()

    def is_closing(self) -> bool:
        return self._closing

    # -- what the sandbox asks -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The process's stdout ended (it exited, the Pod went, or the connection broke)."""
        return self._closing or self.reader.at_eof() or self._failure is not None

    def stderr_tail(self) -> bytes:
        return b"".join(self._stderr)[-STDERR_TAIL_BYTES:]

    # -- internals -------------------------------------------------------------------------

    async def _send(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while self._outbox:
                    await self._ws.send_bytes(self._outbox.popleft())
                self._flushed.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection broke: every later write fails
            self._failure = exc
            self._outbox.clear()
            self._flushed.set()
            self.reader.feed_eof()

    async def _receive(self) -> None:
        try:
            async for message in self._ws:
                if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                    continue
                channel, payload = message.data[0], message.data[1:]
                if channel == STDOUT:
                    self.reader.feed_data(payload)
                elif channel == STDERR:
                    self._keep_stderr(payload)
                elif channel == ERROR and payload:
                    with contextlib.suppress(ValueError):
                        self.status = json.loads(payload)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("attach stream of pod %s broke: %s", self.pod, exc)
        finally:
            if not self.reader.at_eof():
                self.reader.feed_eof()

    def _keep_stderr(self, payload: bytes) -> None:
        self._stderr.append(payload)
        self._stderr_size += len(payload)
        while self._stderr_size > STDERR_TAIL_BYTES and len(self._stderr) > 1:
            self._stderr_size -= len(self._stderr.popleft())
