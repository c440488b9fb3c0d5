"""A client's end of ConnectPort: one TCP connection to a port of a session's sandbox as a byte
stream (``AsyncDispatcherClient.connect_port``), and ``forward``, which serves a local listener
with one such stream per accepted connection (``dispatcher port-forward``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc

from dispatcher.client.base import RequestFailed
from dispatcher.v1 import dispatcher_pb2 as pb

__all__ = ["OpenedPort", "PortConnection", "forward", "opened_port"]


@dataclass(frozen=True, slots=True)
class OpenedPort:
    """What OpenPort answered: the preview URL, its token ("" when public), its expiry."""

    url: str
    token: str
    expire_time: datetime | None

    def __repr__(self) -> str:  # the token is a secret: never in a log line or a traceback
        return f"OpenedPort(url={self.url!r}, token=<{len(self.token)} characters>, expire_time={self.expire_time!r})"


def opened_port(response: pb.OpenPortResponse) -> OpenedPort:
    expires = response.expire_time.ToDatetime(tzinfo=UTC) if response.HasField("expire_time") else None
    return OpenedPort(response.url, response.token, expires)


MAX_MESSAGE = 256 * 1024
"""The largest ``data`` message sent (well under any server's message limit)."""


class PortConnection:
    """One ConnectPort call, open (its ``connected`` was read)."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._ended = False

    @classmethod
    async def open(cls, call: Any, session_id: str, port: int) -> PortConnection:
        """Send the first message and wait for ``connected``.

        Raises:
            RequestFailed: refused (``UNAVAILABLE``: nothing listens on the port; ``NOT_FOUND``, ...).
        """
        try:
            await call.write(pb.ConnectPortRequest(session_id=session_id, port=port))
            first = await call.read()
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None
        if first is grpc.aio.EOF or not first.connected:
            call.cancel()
            raise RequestFailed("INTERNAL", "ConnectPort: the server's first message was not `connected`")
        return cls(call)

    async def read(self) -> bytes:
        """The sandbox's next bytes; ``b""`` once its side half-closed (or the call ended).

        Raises:
            RequestFailed: the call failed.
        """
        while not self._ended:
            try:
                message = await self._call.read()
            except grpc.RpcError as err:
                raise RequestFailed.from_rpc_error(err) from None
            if message is grpc.aio.EOF or message.eof:
                self._ended = True
                break
            if message.data:
                return bytes(message.data)
        return b""

    async def write(self, data: bytes) -> None:
        """Send ``data`` (in messages of at most ``MAX_MESSAGE``), waiting for flow control.

        Raises:
            RequestFailed: the call failed.
        """
        view = memoryview(data)
        try:
            for i in range(0, len(view), MAX_MESSAGE):
                await self._call.write(pb.ConnectPortRequest(data=bytes(view[i : i + MAX_MESSAGE])))
        except grpc.RpcError as err:
            raise RequestFailed.from_rpc_error(err) from None

    async def shut_write(self) -> None:
        """Half-close: the sandbox's side reads its end; reading goes on."""
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._call.write(pb.ConnectPortRequest(close_write=True))
            await self._call.done_writing()

    async def close(self) -> None:
        """End the call both ways (idempotent)."""
        self._call.cancel()


async def forward(
    connect: Callable[[], Any],
    host: str,
    local_port: int,
    *,
    on_listening: Callable[[int], None],
    on_error: Callable[[str], None],
) -> None:
    """Listen on ``host:local_port`` (0: any); each accepted connection gets its own
    ``connect()`` (a ``PortConnection``), bytes copied both ways, half-closes passed on. Runs
    until cancelled."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            port: PortConnection = await connect()
        except RequestFailed as exc:
            on_error(f"{exc.code}: {exc.details}")
            writer.close()
            return
        try:
            await asyncio.gather(_up(reader, port), _down(port, writer))
        except (RequestFailed, ConnectionError) as exc:
            on_error(str(exc))
        finally:
            await port.close()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(serve, host, local_port)
    async with server:
        on_listening(server.sockets[0].getsockname()[1])
        await server.serve_forever()


async def _up(reader: asyncio.StreamReader, port: PortConnection) -> None:
    while data := await reader.read(MAX_MESSAGE):
        await port.write(data)
    await port.shut_write()


async def _down(port: PortConnection, writer: asyncio.StreamWriter) -> None:
    while data := await port.read():
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()
