"""Demultiplexing docker's exec stream, without a daemon: a socketpair plays the daemon."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from dispatcher.sandbox.docker.stream import open_attach_stream


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


async def test_stdout_to_reader_stderr_to_tail_and_stdin_raw() -> None:
    ours, daemon = socket.socketpair()
    stream = await open_attach_stream(ours, frame(1, b"early "), "exec-1")
    try:
        payload = frame(1, b"hello ") + frame(2, b"warning\n") + frame(1, b"world")
        # Split mid-header and mid-payload: framing must survive arbitrary socket boundaries.
        for i in range(0, len(payload), 5):
            daemon.sendall(payload[i : i + 5])
        assert await stream.reader.readexactly(17) == b"early hello world"
        assert stream.stderr_tail() == b"warning\n"
        stream.writer.write(b"to stdin")
        await stream.writer.drain()
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, daemon.recv, 100) == b"to stdin"
        daemon.close()
        assert await stream.reader.read() == b""
        assert stream.closed
    finally:
        stream.close()
        daemon.close()


async def test_stderr_tail_is_bounded() -> None:
    ours, daemon = socket.socketpair()
    stream = await open_attach_stream(ours, b"", "exec-2")
    try:
        # More than a socket buffer: sent from a thread, or the loop would never get to read it.
        data = frame(2, b"e" * 4096) * 100 + frame(1, b"x")
        sender = asyncio.get_running_loop().run_in_executor(None, daemon.sendall, data)
        assert await stream.reader.readexactly(1) == b"x"
        assert len(stream.stderr_tail()) <= 64 << 10
        assert stream.protocol.stderr_dropped > 0
        await sender
    finally:
        stream.close()
        daemon.close()


async def test_unknown_stream_id_breaks_the_reader() -> None:
    ours, daemon = socket.socketpair()
    stream = await open_attach_stream(ours, b"", "exec-3")
    try:
        daemon.sendall(frame(7, b"??"))
        with pytest.raises(ConnectionError):
            await stream.reader.read()
    finally:
        stream.close()
        daemon.close()
