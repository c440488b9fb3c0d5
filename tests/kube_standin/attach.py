"""``pods/attach`` over WebSocket, bridged to ``docker attach`` on the Pod's container.

The channel protocols as the kubelet serves them: each binary message is one channel byte then
data; 0 stdin, 1 stdout, 2 stderr, 3 error (a JSON ``Status`` when the stream ends), 4 resize
(JSON ``{"Width", "Height"}``); ``v5.channel.k8s.io`` adds 255 "close": ``[255, 0]`` half-closes
stdin, which is what lets ``kubectl attach -i`` end a ``cat``. SPDY (what kubectl before 1.29
speaks) is refused with a Status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from typing import Any

import docker
from aiohttp import WSMsgType, web

from tests.kube_standin.status import ApiError, success

V4 = "v4.channel.k8s.io"
V5 = "v5.channel.k8s.io"
PROTOCOLS = (V5, V4)
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


def offered_protocols(request: web.Request) -> list[str]:
    header = ",".join(request.headers.getall("Sec-WebSocket-Protocol", []))
    return [p.strip() for p in header.split(",") if p.strip()]


def check_upgrade(request: web.Request) -> None:
    """Refuse what is not a WebSocket upgrade with one of our subprotocols.

    Raises:
        ApiError: 400 for SPDY, a plain request or no channel subprotocol offered.
    """
    upgrade = request.headers.get("Upgrade", "").lower()
    if upgrade.startswith("spdy"):
        raise ApiError(
            400, "BadRequest", "the stand-in serves attach over WebSocket only; SPDY upgrade refused"
        )
    if upgrade != "websocket":
        raise ApiError(400, "BadRequest", "Upgrade request required")
    if not set(offered_protocols(request)) & set(PROTOCOLS):
        raise ApiError(
            400,
            "BadRequest",
            f"no supported channel subprotocol offered (want one of {', '.join(PROTOCOLS)})",
        )


def _attach_socket(api: docker.APIClient, container_id: str) -> tuple[socket.socket, bytes]:
    """``POST /containers/{id}/attach`` hijacked: the raw socket and the bytes already buffered."""
    # The same request as APIClient.attach_socket, kept whole so bytes http.client read with the
    # headers are not lost (dispatcher/sandbox/docker/client.py does the same for exec).
    res = api._post(
        api._url("/containers/{0}/attach", container_id),
        headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1},
        stream=True,
    )
    api._raise_for_status(res)
    fp = res.raw._fp.fp
    raw = fp.raw
    original = getattr(raw, "_sock", raw)
    original.setblocking(False)
    try:
        leftover = fp.peek() or b""
    finally:
        original.setblocking(True)
    sock = original.dup()
    raw.close()
    original.close()
    return sock, bytes(leftover)


async def _pump_output(
    reader: asyncio.StreamReader, ws: web.WebSocketResponse, *, tty: bool, wanted: set[int]
) -> None:
    """Container output → WebSocket channels, until the container's side ends."""
    if tty:
        while chunk := await reader.read(65536):
            if STDOUT in wanted:
                await ws.send_bytes(bytes([STDOUT]) + chunk)
        return
    while True:
        try:
            header = await reader.readexactly(8)
            stream, size = header[0], struct.unpack(">I", header[4:])[0]
            data = await reader.readexactly(size)
        except asyncio.IncompleteReadError:
            return
        channel = STDERR if stream == 2 else STDOUT
        if channel in wanted and data:
            await ws.send_bytes(bytes([channel]) + data)


async def _pump_input(
    ws: web.WebSocketResponse, writer: asyncio.StreamWriter, container: Any, *, stdin: bool
) -> None:
    """WebSocket channels → container stdin (and resizes), until the client goes."""
    async for msg in ws:
        if msg.type != WSMsgType.BINARY or not msg.data:
            continue
        channel, data = msg.data[0], msg.data[1:]
        if channel == STDIN and stdin:
            writer.write(data)
            await writer.drain()
        elif channel == RESIZE:
            size = json.loads(data)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(container.resize, height=size.get("Height"), width=size.get("Width"))
        elif (
            channel == CLOSE
            and ws.ws_protocol == V5
            and data[:1] == bytes([STDIN])
            and writer.can_write_eof()
        ):
            writer.write_eof()


async def serve_attach(
    request: web.Request, container: Any, *, stdin: bool, stdout: bool, stderr: bool, tty: bool
) -> web.WebSocketResponse:
    """Bridge this upgraded request to the running ``container`` until either side ends."""
    ws = web.WebSocketResponse(protocols=PROTOCOLS, autoping=True)
    sock, leftover = await asyncio.to_thread(_attach_socket, container.client.api, container.id)
    await ws.prepare(request)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    reader.feed_data(leftover)  # before the transport exists, so ahead of anything it reads
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.create_connection(lambda: protocol, sock=sock)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    # The kubelet's readiness signal: an empty message on the lowest writable channel.
    await ws.send_bytes(bytes([STDOUT if stdout else STDERR if stderr else ERROR]))
    wanted = {c for c, on in ((STDOUT, stdout), (STDERR, stderr)) if on}
    output = asyncio.create_task(_pump_output(reader, ws, tty=tty, wanted=wanted))
    inputs = asyncio.create_task(_pump_input(ws, writer, container, stdin=stdin))
    try:
        done, _ = await asyncio.wait({output, inputs}, return_when=asyncio.FIRST_COMPLETED)
        if output in done and not ws.closed:
            await ws.send_bytes(bytes([ERROR]) + json.dumps(success()).encode())
    finally:
        for task in (output, inputs):
            task.cancel()
        await asyncio.gather(output, inputs, return_exceptions=True)
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        await ws.close()
    return ws
