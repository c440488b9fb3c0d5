"""Loopback fixtures for the egress proxy: a proxy served on 127.0.0.1, origin servers that record
every byte they receive, a stub resolver and a connector that only ever connects to loopback.

No test here may send a packet anywhere but loopback, even when the code under test is broken:
names resolve through ``StubResolver`` only, and ``GuardConnector`` records an attempt to any
other address and refuses it without touching the network.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from dispatcher.core.audit import MemoryAuditLog
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, IPAddress, parse_networks
from dispatcher.egress.policy import EgressPolicy
from dispatcher.egress.proxy import EgressContext, EgressLimits, serve_tunnel
from dispatcher.egress.streams import SocketTunnel
from tests.polling import until

LOOPBACK_OPEN = parse_networks(n for n in DEFAULT_DENY_NETWORKS if n != "127.0.0.0/8")
"""The bench's and these tests' deny_networks: the default without 127.0.0.0/8."""


class StubResolver:
    def __init__(self, answers: dict[str, Sequence[str]] | None = None) -> None:
        self.answers = dict(answers or {})
        self.lookups: list[str] = []

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        self.lookups.append(host)
        if host not in self.answers:
            raise OSError(f"stub: no answer for {host}")
        return [ipaddress.ip_address(a) for a in self.answers[host]]


class GuardConnector:
    """Connects to loopback only; any other address is recorded and refused, never contacted."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str, int]] = []

    async def connect(
        self, address: IPAddress, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        self.attempts.append((str(address), port))
        if not address.is_loopback:
            raise OSError(f"test guard: refused to contact {address}")
        return await asyncio.open_connection(str(address), port)


@dataclass
class Origin:
    """A loopback server that records what it receives; ``reply`` is sent back on each connection."""

    port: int = 0
    accepted: int = 0
    received: bytearray = field(default_factory=bytearray)
    reply: bytes = b""
    echo: bool = False
    got: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None

    tasks: set[asyncio.Task[Any]] = field(default_factory=set)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            if self.reply:
                head = await reader.readuntil(b"\r\n\r\n")
                self.received += head
                self.got.set()
                writer.write(self.reply)
                await writer.drain()
                return
            while data := await reader.read(65536):
                self.received += data
                self.got.set()
                if self.echo:
                    writer.write(data)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a handler task of start_server must not end cancelled: 3.11 logs that as an error
        finally:
            writer.close()
            self.tasks.discard(task)


@dataclass
class Harness:
    ctx: EgressContext
    port: int
    resolver: StubResolver
    connector: GuardConnector
    audit: MemoryAuditLog
    metrics: FakeObserver

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def request(self, head: bytes) -> bytes:
        """Send ``head``; the proxy's answer: a tunnel's ``200`` head (the tunnel is then closed), or
        everything it sends until it closes."""
        reader, writer = await self.connect()
        try:
            writer.write(head)
            await writer.drain()
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            if not answer.startswith(b"HTTP/1.1 200 Connection established"):
                answer += await asyncio.wait_for(reader.read(), 10)
            return answer
        finally:
            writer.close()
            await writer.wait_closed()

    def records(self) -> list[dict[str, Any]]:
        return [r for r in self.audit.records if r["kind"] == "egress.connection"]

    async def settled(self, count: int) -> list[dict[str, Any]]:
        """The audit records once ``count`` attempts have finished."""
        await until(lambda: len(self.records()) >= count, f"{count} finished attempts")
        return self.records()


class FakeObserver:
    def __init__(self) -> None:
        self.connections: list[tuple[str, str]] = []
        self.bytes: dict[tuple[str, str], int] = {}

    def egress_connection(self, tenant: str, decision: str) -> None:
        self.connections.append((tenant, decision))

    def egress_bytes(self, tenant: str, direction: str, count: int) -> None:
        key = (tenant, direction)
        self.bytes[key] = self.bytes.get(key, 0) + count


MakeHarness = Callable[..., "asyncio.Future[Harness]"]


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    o = Origin()
    o.server = await asyncio.start_server(o.handle, "127.0.0.1", 0)
    o.port = o.server.sockets[0].getsockname()[1]
    yield o
    o.server.close()
    await _finish(o.tasks)
    await o.server.wait_closed()


async def _finish(tasks: set[asyncio.Task[Any]]) -> None:
    """Connection handlers still running when a test ends are cancelled and awaited."""
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
async def harness() -> AsyncIterator[Callable[..., Any]]:
    servers: list[asyncio.Server] = []
    contexts: list[EgressContext] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def make(
        policy: EgressPolicy | None = None,
        *,
        allow: Sequence[str] | None = None,
        answers: dict[str, Sequence[str]] | None = None,
        limits: EgressLimits | None = None,
        observer: Any = None,
        **kwargs: Any,
    ) -> Harness:
        policy = policy or EgressPolicy()
        resolver, connector = StubResolver(answers), GuardConnector()
        audit, metrics = MemoryAuditLog(), FakeObserver()
        ctx = EgressContext(
            tenant_id="acme",
            session_id="ses_1",
            policy=policy,
            allow=policy.allow if allow is None else allow,
            resolver=resolver,
            connector=connector,
            audit=audit,
            observer=observer or metrics,
            limits=limits or EgressLimits(),
            **kwargs,
        )
        contexts.append(ctx)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await serve_tunnel(SocketTunnel(reader, writer), ctx)
            except asyncio.CancelledError:
                pass  # ended by ctx.close(); see Origin.handle
            finally:
                tasks.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return Harness(ctx, server.sockets[0].getsockname()[1], resolver, connector, audit, metrics)

    yield make
    for ctx in contexts:
        ctx.close()
    for server in servers:
        server.close()
    await _finish(tasks)
    for server in servers:
        await server.wait_closed()
