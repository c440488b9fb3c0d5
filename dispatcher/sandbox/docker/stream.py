"""An attached ``docker exec`` socket as an asyncio reader/writer pair.

With ``tty=False`` the daemon multiplexes the process's stdout and stderr onto one stream, each
chunk behind an 8-byte header (stream id, three zero bytes, big-endian length); stdin is written
raw. ``DemuxProtocol`` splits the stream as it arrives: stdout feeds the ``StreamReader`` that the
agent channel reads, stderr goes to a bounded tail kept for diagnostics. Because the reader is the
protocol's own stream reader, asyncio's flow control applies: when the channel falls behind, the
socket stops being read and the daemon (then the agent) blocks, so memory stays bounded.

The headers come from the daemon, not from the sandbox; the payload is untrusted and parsed by the
channel.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from collections.abc import Callable

_HEADER = struct.Struct(">BxxxL")
STDOUT, STDERR = 1, 2
STDERR_TAIL_BYTES = 64 << 10
READER_LIMIT = 1 << 20
"""StreamReader limit; the socket pauses once twice this much is buffered and unread."""


class StreamProtocolError(ConnectionError):
    """The daemon's framing was not what docker's stream format promises."""


class DemuxProtocol(asyncio.StreamReaderProtocol):
    """Splits docker's multiplexed exec stream; stdout to the reader, stderr to a tail."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        *,
        initial: bytes = b"",
        stderr_limit: int = STDERR_TAIL_BYTES,
        on_stderr: Callable[[bytes], None] | None = None,
    ) -> None:
        super().__init__(reader)
        self._stdout = reader
        self._on_stderr = on_stderr
        # Bytes the HTTP client read past the upgrade headers; parsed before anything from the socket.
        self._pending = bytearray(initial)
        self._stderr: deque[bytes] = deque()
        self._stderr_size = 0
        self._stderr_limit = stderr_limit
        self.stderr_dropped = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._pending:
            self.data_received(b"")

    def data_received(self, data: bytes) -> None:
        self._pending += data
        buf = self._pending
        pos = 0
        try:
            while len(buf) - pos >= _HEADER.size:
                stream, size = _HEADER.unpack_from(buf, pos)
                if len(buf) - pos - _HEADER.size < size:
                    break
                start = pos + _HEADER.size
                payload = bytes(buf[start : start + size])
                pos = start + size
                if stream == STDOUT:
                    self._stdout.feed_data(payload)
                elif stream == STDERR:
                    if self._on_stderr is not None:
                        self._on_stderr(payload)
                    else:
                        self._keep_stderr(payload)
                elif stream != 0:
                    raise StreamProtocolError(f"unknown docker stream id {stream}")
        except StreamProtocolError as exc:
            self._stdout.set_exception(exc)
            transport = self._transport_or_none()
            if isinstance(transport, asyncio.Transport):
                transport.abort()
            return
        finally:
            del buf[:pos]

    def _transport_or_none(self) -> asyncio.BaseTransport | None:
        return getattr(self, "_transport", None)

    def _keep_stderr(self, payload: bytes) -> None:
        self._stderr.append(payload)
        self._stderr_size += len(payload)
        while self._stderr_size > self._stderr_limit and len(self._stderr) > 1:
            dropped = self._stderr.popleft()
            self._stderr_size -= len(dropped)
            self.stderr_dropped += len(dropped)

    def stderr_tail(self) -> bytes:
        """The last ``stderr_limit``-ish bytes the process wrote to stderr."""
        return b"".join(self._stderr)[-self._stderr_limit :]


class AttachStream:
    """One attached exec: ``reader`` is its stdout, ``writer`` its stdin."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        protocol: DemuxProtocol,
        exec_id: str,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.protocol = protocol
        self.exec_id = exec_id

    @property
    def closed(self) -> bool:
        """The process's stdout ended (it exited or the connection broke)."""
        return self.reader.at_eof() or self.writer.is_closing()

    def stderr_tail(self) -> bytes:
        return self.protocol.stderr_tail()

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()


class SocketStream:
    """The agent's channel on its own socket (``agent/listener.py``), with the exec that started it:
    the exec's stderr is the agent's, and the exec's end is the agent's end."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, started_by: AttachStream
    ) -> None:
        self.reader = reader
        self.writer = writer
        self._exec = started_by

    @property
    def exec_id(self) -> str:
        return self._exec.exec_id

    @property
    def closed(self) -> bool:
        """The socket ended, or the agent process did."""
        return self.reader.at_eof() or self.writer.is_closing() or self._exec.closed

    def stderr_tail(self) -> bytes:
        return self._exec.stderr_tail()

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
        self._exec.close()


async def open_attach_stream(
    sock: socket.socket,
    leftover: bytes,
    exec_id: str,
    *,
    limit: int = READER_LIMIT,
    on_stderr: Callable[[bytes], None] | None = None,
) -> AttachStream:
    """Wrap an upgraded exec socket (plus bytes already read past the HTTP headers).

    ``on_stderr`` receives stderr chunks as they arrive instead of the bounded tail.
    """
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=limit, loop=loop)
    protocol = DemuxProtocol(reader, initial=leftover, on_stderr=on_stderr)
    sock.setblocking(False)
    transport, _ = await loop.create_connection(lambda: protocol, sock=sock)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return AttachStream(reader, writer, protocol, exec_id)
