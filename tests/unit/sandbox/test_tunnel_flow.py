"""Tunnel flow control between the real agent (a subprocess, as the local backend runs it) and the
host's ``AgentChannel``: a connection whose reader stalls makes neither end buffer more than a
window, and holds up neither another connection nor an ordinary op on the same channel.

Bytes are counted exactly: what the kernel holds for a loopback connection is read from
``/proc/net/tcp`` (the agent is a local process, so its sockets are in this network namespace),
and what crossed the channel is counted on the channel itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from dispatcher.egress.proxy import TunnelStream
from dispatcher.sandbox.agent.protocol import HOST_WINDOW, SANDBOX_WINDOW, TUNNEL_CHUNK, TunnelSend
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.local import AGENT_PATH, STOP_TIMEOUT_SECONDS
from dispatcher.sandbox.tunnels import ChannelTunnel
from tests.polling import until

WAIT = 10.0


class Rig:
    """The agent's channel with its listener; every accepted connection's stream lands in ``opened``."""

    def __init__(self, channel: AgentChannel, root: Path) -> None:
        self.channel = channel
        self.root = root
        self.port = 0
        self.opened: asyncio.Queue[ChannelTunnel] = asyncio.Queue()
        self.pushed: dict[int, int] = {}  # tunnel bytes the host put on the channel, by connection
        self._done = asyncio.Event()
        send = channel.send_unanswered

        async def counting(request: Any) -> None:
            if isinstance(request, TunnelSend):
                self.pushed[request.conn] = self.pushed.get(request.conn, 0) + len(request.data)
            await send(request)

        channel.send_unanswered = counting  # type: ignore[method-assign]

    async def serve(self, stream: TunnelStream, call: str | None) -> None:
        assert isinstance(stream, ChannelTunnel)
        self.opened.put_nowait(stream)
        await self._done.wait()  # the test drives the stream; returning would close it

    async def connect(self, *, rcvbuf: int | None = None, sndbuf: int | None = None) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # small kernel buffers: the stall comes soon, the counts stay small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if sndbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        return sock

    def stop(self) -> None:
        self._done.set()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    env = {key: os.environ[key] for key in ("PATH", "HOME") if key in os.environ}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        AGENT_PATH,
        "--root",
        str(tmp_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None and proc.stdin is not None
    channel = AgentChannel(proc.stdout, proc.stdin, workspace_root=str(tmp_path))
    rig = Rig(channel, tmp_path)
    try:
        rig.port = await channel.open_tunnels(rig.serve, port=0, env={})
        yield rig
    finally:
        rig.stop()
        await channel.close()
        try:  # as LocalSandbox stops it: an agent blocked writing to a closed channel is killed
            await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_SECONDS)
        except TimeoutError:
            proc.kill()
            await proc.wait()
        # What the closed channel left unread: read to the end, the pipe's transport closes (a
        # paused one would stay open and warn when collected, in whichever test runs then).
        await asyncio.wait_for(proc.stdout.read(), WAIT)


def _queues(local_port: int, remote_port: int) -> tuple[int, int]:
    """(tx_queue, rx_queue) of the loopback socket ``local_port`` -> ``remote_port``."""
    with open("/proc/net/tcp") as f:
        for line in f.read().splitlines()[1:]:
            fields = line.split()
            local, remote, queues = fields[1], fields[2], fields[4]
            if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
                tx, rx = queues.split(":")
                return int(tx, 16), int(rx, 16)
    raise AssertionError(f"no socket {local_port} -> {remote_port} in /proc/net/tcp")


def _in_kernel(rig: Rig, client: socket.socket) -> int:
    """Bytes of the connection the kernel holds between the agent's socket and the client's."""
    port = client.getsockname()[1]
    agent_tx, agent_rx = _queues(rig.port, port)
    client_tx, client_rx = _queues(port, rig.port)
    return agent_tx + agent_rx + client_tx + client_rx


async def _settled(read: Callable[[], tuple[int, ...]], what: str) -> tuple[int, ...]:
    """``read()`` once it gives the same answer twice running, 50 ms apart (a stall is a state
    that stops changing; polled with a deadline)."""
    last = [read()]

    def same_again() -> bool:
        now, before = read(), last[0]
        last[0] = now
        return now == before

    await asyncio.sleep(0.05)
    await until(same_again, f"{what} to settle", timeout=WAIT, interval=0.05)
    return last[0]


async def _until(check: Callable[[], bool], what: str) -> None:
    await until(check, what, timeout=WAIT)


async def _others_go_on(rig: Rig) -> None:
    """A second connection carries bytes both ways, and file ops complete, while the first is stuck."""
    other = await rig.connect()
    try:
        stream = await asyncio.wait_for(rig.opened.get(), WAIT)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(other, b"ping")
        assert await asyncio.wait_for(stream.read(100), WAIT) == b"ping"
        await asyncio.wait_for(stream.write(b"pong"), WAIT)
        assert await asyncio.wait_for(loop.sock_recv(other, 100), WAIT) == b"pong"
    finally:
        other.close()
    await asyncio.wait_for(rig.channel.write("note.txt", "still served"), WAIT)
    assert await asyncio.wait_for(rig.channel.read("note.txt"), WAIT) == "still served"


async def test_a_sandbox_reader_that_stops_reading_stalls_the_host_writer_at_one_window(rig: Rig) -> None:
    stalled = await rig.connect(rcvbuf=4096)
    stream = await asyncio.wait_for(rig.opened.get(), WAIT)
    written = 0

    async def flood() -> None:  # what the proxy does with a large download
        nonlocal written
        block = b"x" * TUNNEL_CHUNK
        while True:
            await stream.write(block)
            written += len(block)

    writer = asyncio.create_task(flood())
    try:
        pushed, in_kernel, window = await _settled(
            lambda: (rig.pushed.get(stream.conn, 0), _in_kernel(rig, stalled), stream._window),
            "the stalled connection",
        )
        # The host stopped at its window: everything it sent the agent has written to the socket
        # (in_kernel), and the rest, the agent's buffer, is at most one window.
        assert window == 0 and not writer.done()
        assert pushed - in_kernel <= SANDBOX_WINDOW, (pushed, in_kernel)
        assert pushed >= SANDBOX_WINDOW and written <= pushed

        await asyncio.wait_for(_others_go_on(rig), WAIT)
        assert rig.pushed[stream.conn] == pushed, "the stalled connection stays stalled meanwhile"

        # Reading again reopens the window: the flood goes on.
        loop = asyncio.get_running_loop()
        got = 0
        while rig.pushed[stream.conn] <= pushed + SANDBOX_WINDOW:
            got += len(await asyncio.wait_for(loop.sock_recv(stalled, 1 << 20), WAIT))
        assert got > 0
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
        stalled.close()


async def test_a_host_that_stops_reading_holds_the_sandbox_writer_at_one_window(rig: Rig) -> None:
    writer = await rig.connect(sndbuf=4096)
    stream = await asyncio.wait_for(rig.opened.get(), WAIT)
    sent = 0
    block = b"y" * TUNNEL_CHUNK

    def send_what_fits() -> int:
        nonlocal sent
        try:
            while True:
                sent += writer.send(block)
        except BlockingIOError:
            pass
        return sent

    try:
        # The sandbox side writes as long as the kernel takes it; the host's proxy never reads.
        sent_now, in_kernel, buffered = await _settled(
            lambda: (send_what_fits(), _in_kernel(rig, writer), stream._buffered), "the unread connection"
        )
        # The agent read exactly one window and stopped: the host buffers that window, the agent
        # nothing, and the rest waits in the kernel.
        assert buffered == HOST_WINDOW
        assert sent_now - in_kernel == HOST_WINDOW, (sent_now, in_kernel)

        await asyncio.wait_for(_others_go_on(rig), WAIT)
        assert stream._buffered == HOST_WINDOW

        # Reading on the host reopens the agent's window: more of what the sandbox sent comes.
        taken = 0
        while taken <= HOST_WINDOW:
            taken += len(await asyncio.wait_for(stream.read(TUNNEL_CHUNK), WAIT))
        await _until(lambda: stream._buffered > 0, "the agent to send again")
    finally:
        writer.close()


async def test_a_download_through_a_slow_reader_arrives_whole_in_order_then_ends(rig: Rig) -> None:
    """Some bytes the agent writes as they come, some wait for the socket; the host's close comes
    while some still wait: all of them arrive, in order, and then the end."""
    client = await rig.connect(rcvbuf=4096)
    stream = await asyncio.wait_for(rig.opened.get(), WAIT)
    sizes = (1, 1000, TUNNEL_CHUNK, 70_000, TUNNEL_CHUNK - 1, 3)
    pieces = [bytes([i % 251]) * sizes[i % len(sizes)] for i in range(40)]
    expected = b"".join(pieces)

    async def download() -> None:
        for piece in pieces:
            await stream.write(piece)
        await stream.close()

    writer = asyncio.create_task(download())
    loop = asyncio.get_running_loop()
    got = bytearray()
    try:
        while chunk := await asyncio.wait_for(loop.sock_recv(client, 8192), WAIT):
            got += chunk
        assert len(got) == len(expected) and got == expected
        await asyncio.wait_for(writer, WAIT)
    finally:
        writer.cancel()
        client.close()


async def test_a_sandbox_reset_during_a_download_ends_the_hosts_writes(rig: Rig) -> None:
    client = await rig.connect(rcvbuf=4096)
    stream = await asyncio.wait_for(rig.opened.get(), WAIT)

    async def flood() -> None:
        block = b"z" * TUNNEL_CHUNK
        while True:
            await stream.write(block)

    writer = asyncio.create_task(flood())
    try:
        await _settled(lambda: (rig.pushed.get(stream.conn, 0),), "the stalled download")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, with the agent's bytes unread
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(writer, WAIT)
        assert await asyncio.wait_for(stream.read(100), WAIT) == b""
    finally:
        writer.cancel()
        client.close()
