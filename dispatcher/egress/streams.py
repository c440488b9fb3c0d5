"""A ``TunnelStream`` over an asyncio stream pair: what tests and benches serve tunnels over, on
loopback sockets, until (and beside) the agent channel's multiplexed connections."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["SocketTunnel"]


class SocketTunnel:
    """One accepted socket connection as a ``proxy.TunnelStream``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, n: int) -> bytes:
        return await self._reader.read(n)

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
