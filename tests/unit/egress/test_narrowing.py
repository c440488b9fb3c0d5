"""Issue 37 item 8: a session's ``egress_allow`` is a hard bound. Through the server's own
``EgressGateway`` (the session's context as it builds it, its question to a human under the approval
mode in force) with every approval mode, and the tenant's policy letting the network class run
unasked: the session's host is reached, a host only its tenant lists and a host on no list are
refused without asking anyone.

Names resolve through ``StubResolver`` to loopback and ``GuardConnector`` contacts loopback only.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from dispatcher.core.approval.broker import ConfirmationBroker, Decision
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy, Mode
from dispatcher.core.audit import MemoryAuditLog
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.events.bus import EventBus
from dispatcher.core.sessions.session import Session
from dispatcher.core.sessions.state import SessionState
from dispatcher.core.types import SideEffect
from dispatcher.egress.policy import EgressPolicy, Unknown
from dispatcher.egress.streams import SocketTunnel
from dispatcher.server.sessions.egress import EgressGateway
from tests.polling import until
from tests.unit.egress.conftest import LOOPBACK_OPEN, GuardConnector, Origin, StubResolver

SESSION_HOST, TENANT_HOST, UNLISTED_HOST = "session.test", "tenant.test", "nolist.test"
CAUTIOUS = ConfirmationPolicy.preset("cautious")
NETWORK_AUTO = dataclasses.replace(CAUTIOUS, default={**CAUTIOUS.default, SideEffect.NETWORK: Mode.AUTO})
MODES = {
    "autonomous": ("autonomous", CAUTIOUS),
    "cautious": ("cautious", CAUTIOUS),
    "manual": ("manual", CAUTIOUS),
    "network-auto": ("cautious", NETWORK_AUTO),
}
"""Approval mode in force and the tenant's confirmation policy; in the asking modes a human
answers every question with allow (the most a human can say)."""


class AllowingBroker(ConfirmationBroker):
    """A human who allows whatever they are asked, at once; the ids asked about are kept."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def open(self, *, rememberable: bool = True) -> tuple[str, asyncio.Future[tuple[Decision, bool]]]:
        request_id, answer = super().open(rememberable=rememberable)
        self.asked.append(request_id)
        self.resolve(request_id, Decision.ALLOW)
        return request_id, answer


@dataclasses.dataclass
class Proxy:
    state: SessionState
    port: int
    audit: MemoryAuditLog
    connector: GuardConnector
    human: AllowingBroker

    async def connect(self, host: str, port: int) -> bytes:
        """The proxy's answer to ``CONNECT host:port``: its status line."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            return head.split(b"\r\n", 1)[0]
        finally:
            writer.close()
            await writer.wait_closed()

    async def reasons(self, count: int) -> list[str]:
        def records() -> list[dict[str, object]]:
            return [r for r in self.audit.records if r["kind"] == "egress.connection"]

        await until(lambda: len(records()) >= count, f"{count} finished attempts")
        return [str(r["reason"]) for r in records()]


MakeProxy = Callable[[str, ConfirmationPolicy, Unknown, tuple[str, ...]], Awaitable[Proxy]]
"""Approval mode, the tenant's confirmation policy, its ``unknown``, the session's list."""


@pytest.fixture
async def proxy(tmp_path: Path, origin: Origin) -> AsyncIterator[MakeProxy]:
    made: list[asyncio.Server] = []
    handlers: set[asyncio.Task[None]] = set()

    async def make(
        mode: str, confirmation: ConfirmationPolicy, unknown: Unknown, egress_allow: tuple[str, ...]
    ) -> Proxy:
        tenant = EgressPolicy(
            allow=(SESSION_HOST, TENANT_HOST),
            unknown=unknown,
            ports=(origin.port,),
            deny_networks=LOOPBACK_OPEN,
        )
        audit, connector = MemoryAuditLog(), GuardConnector()
        answers: dict[str, Sequence[str]] = {
            h: ["127.0.0.1"] for h in (SESSION_HOST, TENANT_HOST, UNLISTED_HOST)
        }
        gateway = EgressGateway(
            lambda _tenant: (tenant, confirmation),
            default_policy=CAUTIOUS,
            confirmation_timeout=5.0,
            audit=audit,
            resolver=StubResolver(answers),
            connector=connector,
        )
        session = Session(
            session_id="ses_narrow",
            workspace_path=str(tmp_path),
            tenant_id="acme",
            capabilities=Capabilities(egress_allow=egress_allow),
            approval_mode=mode,
        )
        human = AllowingBroker()
        state = SessionState(
            session=session, bus=EventBus(session.session_id), semaphore=asyncio.Semaphore(), broker=human
        )
        gateway.session_opened(state)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            handlers.add(task)
            try:
                await gateway.serve(session.session_id, SocketTunnel(reader, writer), None)
            except asyncio.CancelledError:
                pass  # ended by the teardown, as conftest's harness does
            finally:
                handlers.discard(task)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        made.append(server)
        gateway_port = server.sockets[0].getsockname()[1]
        return Proxy(state, gateway_port, audit, connector, human)

    yield make
    for server in made:
        server.close()
    for task in list(handlers):
        task.cancel()
    await asyncio.gather(*handlers, return_exceptions=True)
    for server in made:
        await server.wait_closed()


@pytest.mark.parametrize("unknown", list(Unknown))
@pytest.mark.parametrize("mode", list(MODES))
async def test_a_narrowed_session_reaches_its_own_hosts_only_in_every_mode(
    proxy: MakeProxy, origin: Origin, mode: str, unknown: Unknown
) -> None:
    approval, confirmation = MODES[mode]
    p: Proxy = await proxy(approval, confirmation, unknown, (SESSION_HOST,))
    assert await p.connect(SESSION_HOST, origin.port) == b"HTTP/1.1 200 Connection established"
    for host in (TENANT_HOST, UNLISTED_HOST):
        assert (await p.connect(host, origin.port)).startswith(b"HTTP/1.1 403 egress refused"), host
    assert sorted(await p.reasons(3)) == ["listed", "not_listed", "not_listed"]  # a tunnel ends last
    assert p.human.asked == []  # nobody was asked: not even a human's yes widens the session's list
    assert origin.accepted == 1
    assert p.connector.attempts == [("127.0.0.1", origin.port)]


@pytest.mark.parametrize("mode", list(MODES))
async def test_a_session_with_its_tenants_whole_list_keeps_the_tenants_prompt(
    proxy: MakeProxy, origin: Origin, mode: str
) -> None:
    """Not narrowed (its list is its tenant's): an unlisted host is the approval mode's to decide."""
    approval, confirmation = MODES[mode]
    p: Proxy = await proxy(approval, confirmation, Unknown.PROMPT, (SESSION_HOST, TENANT_HOST))
    assert await p.connect(UNLISTED_HOST, origin.port) == b"HTTP/1.1 200 Connection established"
    assert await p.reasons(1) == ["approved"]
    assert len(p.human.asked) == (0 if mode in ("autonomous", "network-auto") else 1)
