"""``Sandbox.connect_port``: a TCP connection to ``127.0.0.1:PORT`` inside the sandbox, over its
agent's channel, held to one behaviour on every sandbox with a way in: bytes both ways
byte-identical, half-close honoured each way, a refused port and a bad one told apart, a stalled
reader holding the writer at a bounded window, connections independent of each other.

The servers are ``port_server.py``, started as background processes of the session's table."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.core.process_api import ProcessStart
from dispatcher.core.sandbox_api import PortError, PortStream
from dispatcher.sandbox.agent.protocol import SANDBOX_WINDOW
from tests.contract.targets import Capability, Target
from tests.polling import until

SERVER = (Path(__file__).parent / "port_server.py").read_text()
CHUNK = 1 << 16


@pytest.fixture
def ports(target: Target) -> Target:
    target.require(Capability.PORTS)
    target.require(Capability.PROCESSES)
    return target


async def _server(target: Target, mode: str) -> int:
    """Start ``port_server.py`` in ``mode``; the port it listens on."""
    await target.sandbox.write("port_server.py", SERVER)
    portfile = f"{mode}.port"
    await target.sandbox.processes().start(
        ProcessStart(f"p_{mode}", f"exec python3 port_server.py {mode} {portfile}")
    )
    await until(lambda: target.sandbox.exists(portfile), f"the {mode} server to listen", timeout=20)
    return int(await target.sandbox.read(portfile))


@contextlib.asynccontextmanager
async def _connected(target: Target, port: int) -> AsyncIterator[PortStream]:
    stream = await target.sandbox.connect_port(port)
    try:
        yield stream
    finally:
        await stream.close()


async def _read_all(stream: PortStream) -> bytes:
    out = bytearray()
    while data := await stream.read(CHUNK):
        out += data
    return bytes(out)


async def test_twenty_megabytes_echo_back_byte_identical_and_the_half_close_ends_them(
    ports: Target,
) -> None:
    port = await _server(ports, "echo")
    payload = os.urandom(1 << 20) * 20
    async with _connected(ports, port) as stream:

        async def send() -> None:
            for i in range(0, len(payload), CHUNK * 4):
                await stream.write(payload[i : i + CHUNK * 4])
            await stream.shut_write()  # the server's echo loop ends, then it half-closes too

        sender = asyncio.create_task(send())
        back = await _read_all(stream)
        await sender
    assert len(back) == len(payload)
    assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()


async def test_a_half_close_reaches_the_server_and_its_answer_still_comes_back(ports: Target) -> None:
    port = await _server(ports, "count")
    async with _connected(ports, port) as stream:
        await stream.write(b"x" * 12345)
        await stream.shut_write()
        assert await _read_all(stream) == b"got 12345"
        with pytest.raises(ConnectionResetError):  # written after the half-close: refused here
            await stream.write(b"late")


async def test_connections_are_independent(ports: Target) -> None:
    port = await _server(ports, "count")
    async with _connected(ports, port) as one, _connected(ports, port) as two:
        await two.write(b"b" * 7)
        await two.shut_write()
        await one.write(b"a" * 3)
        await one.shut_write()
        assert await _read_all(one) == b"got 3"
        assert await _read_all(two) == b"got 7"


async def test_a_stalled_reader_holds_the_writer_at_a_bounded_window(ports: Target) -> None:
    port = await _server(ports, "sink")
    total = 64 << 20
    written = 0
    async with _connected(ports, port) as stream:

        async def send() -> None:
            nonlocal written
            block = b"s" * CHUNK
            while written < total:
                await stream.write(block)
                written += len(block)
            await stream.shut_write()

        sender = asyncio.create_task(send())
        seen: list[int] = []

        def stalled() -> bool:
            # The same count over 20 polls in a row: the writer waits for the sandbox's credit.
            seen.append(written)
            return len(seen) > 20 and len(set(seen[-20:])) == 1

        await until(stalled, "the writer to stall", timeout=30, interval=0.05)
        assert not sender.done()
        # A window in the agent and what the kernel's loopback buffers hold: far below 64 MiB.
        assert SANDBOX_WINDOW <= written < 16 << 20, written
        await ports.sandbox.write("go", "")
        assert await _read_all(stream) == b"got %d" % total
        await sender


async def test_a_port_nothing_listens_on_is_refused(ports: Target) -> None:
    port = await _server(ports, "count")
    await ports.sandbox.processes().signal("p_count", "KILL")
    await until(lambda: _closed(ports, port), "the server's port to close", timeout=20)
    with pytest.raises(PortError) as err:
        await ports.sandbox.connect_port(port)
    assert err.value.code == "refused"
    assert str(port) in str(err.value)


async def _closed(target: Target, port: int) -> bool:
    try:
        stream = await target.sandbox.connect_port(port)
    except PortError:
        return True
    await stream.close()
    return False


@pytest.mark.parametrize("port", [0, -1, 65536, 1 << 40])
async def test_a_port_out_of_range_is_refused_before_anything_is_sent(target: Target, port: int) -> None:
    with pytest.raises(PortError) as err:
        await target.sandbox.connect_port(port)
    assert err.value.code == "bad_port"


async def test_a_sandbox_without_a_way_in_says_so(target: Target) -> None:
    if target.has(Capability.PORTS):
        pytest.skip(f"{target.name} has ports (the other tests hold it to them)")
    with pytest.raises(PortError) as err:
        await target.sandbox.connect_port(8000)
    assert err.value.code == "unsupported"
    assert "FakeSandbox" in str(err.value)
