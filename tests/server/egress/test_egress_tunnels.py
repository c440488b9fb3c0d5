"""Issue 20 end to end through gRPC with the local backend: a command's proxy connection travels
over the agent channel to the server's proxy, and every decision, question, audit record and metric
follows. Destinations are loopback origin servers only (the tests' config takes 127.0.0.0/8 out of
``deny_networks``); a refused name is refused before anything resolves it."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.dispatcher import Decision
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS
from tests.events import ToolConfirmationRequested
from tests.server.conftest import TOKEN_ALPHA, Harness, ServerFactory
from tests.server.helpers import next_event, text_of, until

CLIENT = str(Path(__file__).parent.parent / "proxy_client.py")
LOOPBACK_OPEN = [n for n in DEFAULT_DENY_NETWORKS if n != "127.0.0.0/8"]


class Echo:
    """A loopback origin: answers ``reply`` to an HTTP request, or echoes a tunnel's bytes."""

    def __init__(self, reply: bytes = b"") -> None:
        self.reply = reply
        self.accepted = 0
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            if self.reply:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(self.reply)
                await writer.drain()
                return
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def echo() -> AsyncIterator[Echo]:
    origin = Echo()
    origin.server = await asyncio.start_server(origin.handle, "127.0.0.1", 0)
    yield origin
    origin.server.close()


def _egress(port: int, **over: Any) -> dict[str, Any]:
    return {"egress": {"allow": ["127.0.0.1"], "ports": [port], "deny_networks": LOOPBACK_OPEN, **over}}


def _audit(h: Harness) -> list[dict[str, Any]]:
    path = h.tmp / "home" / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r.get("kind") == "egress.connection"]


async def _records(h: Harness, count: int) -> list[dict[str, Any]]:
    """The egress audit records once there are ``count`` (each is written as its attempt ends)."""
    await until(lambda: len(_audit(h)) >= count, f"{count} egress audit records")
    records = _audit(h)
    assert len(records) == count, records
    return records


def _metrics(h: Harness) -> str:
    port = h.server.observability.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _shell(args: str) -> dict[str, Any]:
    # NO_PROXY names 127.0.0.1 (loopback stays direct); these tests go through the proxy on purpose.
    return {"command": f"{sys.executable} {CLIENT} {args}", "env": {"NO_PROXY": "", "no_proxy": ""}}


async def test_a_listed_host_is_reached_through_the_proxy_with_audit_and_metrics(
    make_server: ServerFactory, echo: Echo
) -> None:
    echo.reply = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    h = await make_server(metrics={"listen": "127.0.0.1:0"}, **_egress(echo.port))
    client = h.client(TOKEN_ALPHA)
    session = await client.create_session()
    result = await client.call(
        session.session_id, "shell", _shell(f"get http://127.0.0.1:{echo.port}/x"), tool_use_id="tu_get"
    )
    assert "status: HTTP/1.1 200 OK" in text_of(result) and "body bytes: 5" in text_of(result)
    (record,) = await _records(h, 1)
    assert record["decision"] == "allowed" and record["reason"] == "listed"
    assert (record["host"], record["port"], record["address"]) == ("127.0.0.1", echo.port, "127.0.0.1")
    assert record["tool_use_id"] == "tu_get" and record["session_id"] == session.session_id
    assert record["bytes_in"] > 5 and record["bytes_out"] > 0 and record["method"] == "GET"
    text = _metrics(h)
    assert 'dispatcher_egress_connections_total{decision="allowed",tenant="alpha"} 1.0' in text
    assert 'dispatcher_egress_bytes_total{direction="in",tenant="alpha"}' in text


async def test_by_default_a_connection_is_refused_at_once_with_the_403_text(harness: Harness) -> None:
    client = harness.client(TOKEN_ALPHA)
    session = await client.create_session()
    started = time.monotonic()
    result = await client.call(session.session_id, "shell", _shell("connect pkgs.example.com 443"))
    text = text_of(result)
    assert (
        "status: HTTP/1.1 403 egress refused: pkgs.example.com:443: pkgs.example.com is not on this session's"
        in text
    )
    assert "no host is allowed: this sandbox has no network access" in text
    assert time.monotonic() - started < 5  # the whole call; the refusal itself:
    seconds = float(text.split("seconds: ")[1].split()[0])
    assert seconds < 1.0
    (record,) = await _records(harness, 1)
    assert (record["decision"], record["reason"], record["address"]) == ("refused", "not_listed", None)


async def _prompted(h: Harness, echo: Echo, token: str) -> tuple[Any, Any, Any, str]:
    agent, human = h.client(token), h.client(token)
    session = await agent.create_session()
    sid = session.session_id
    call = asyncio.create_task(
        agent.call(sid, "shell", _shell(f"connect 127.0.0.1 {echo.port}"), tool_use_id="tu_pip")
    )
    request = await next_event(human, sid, ToolConfirmationRequested)
    return agent, human, (call, request), sid


async def test_an_unlisted_host_is_asked_about_and_a_second_client_answers(
    make_server: ServerFactory, echo: Echo
) -> None:
    h = await make_server(**_egress(echo.port, allow=[], unknown="prompt"))
    agent, human, (call, request), sid = await _prompted(h, echo, TOKEN_ALPHA)  # cautious: network asks
    assert request.tool_use_id == "tu_pip"
    payload = request.payload
    assert (payload.tool_name, payload.input_summary) == ("egress", f"connect 127.0.0.1:{echo.port}")
    assert str(payload.side_effect) in ("network", "SIDE_EFFECT_NETWORK")
    assert echo.accepted == 0  # nothing reached it before the answer
    await human.resolve_confirmation(sid, str(payload.request_id), Decision.ALLOW, remember=True)
    result = await asyncio.wait_for(call, 20)
    assert "status: HTTP/1.1 200 Connection established" in text_of(result)
    assert "echo: ping" in text_of(result)
    # remembered: the next connection to that host is not asked about
    again = await agent.call(sid, "shell", _shell(f"connect 127.0.0.1 {echo.port}"))
    assert "echo: ping" in text_of(again)
    records = await _records(h, 2)
    assert [r["reason"] for r in records] == ["remembered", "remembered"]


async def test_a_denied_or_unanswered_prompt_is_a_403(make_server: ServerFactory, echo: Echo) -> None:
    h = await make_server(
        dispatcher={"confirmation_timeout": 0.5}, **_egress(echo.port, allow=[], unknown="prompt")
    )
    agent, human, (call, request), sid = await _prompted(h, echo, TOKEN_ALPHA)
    await human.resolve_confirmation(sid, str(request.payload.request_id), Decision.DENY)
    assert "403 egress refused: 127.0.0.1:" in text_of(await asyncio.wait_for(call, 20))
    assert "a human denied the connection" in text_of(await asyncio.wait_for(call, 20))
    timed_out = await agent.call(sid, "shell", _shell(f"connect 127.0.0.1 {echo.port}"))
    assert "nobody answered the confirmation request in time" in text_of(timed_out)
    assert echo.accepted == 0
    records = await _records(h, 2)
    assert [r["reason"] for r in records] == ["prompt_denied", "prompt_timeout"]


async def test_an_autonomous_session_is_not_asked(make_server: ServerFactory, echo: Echo) -> None:
    h = await make_server(**_egress(echo.port, allow=[], unknown="prompt"))
    client = h.client(TOKEN_ALPHA)
    session = await client.create_session(mode="autonomous")
    result = await client.call(session.session_id, "shell", _shell(f"connect 127.0.0.1 {echo.port}"))
    assert "echo: ping" in text_of(result)
    (record,) = await _records(h, 1)
    assert record["reason"] == "approved"


async def test_cancelling_the_call_or_closing_the_session_closes_its_tunnels(
    make_server: ServerFactory, echo: Echo
) -> None:
    h = await make_server(**_egress(echo.port))
    client = h.client(TOKEN_ALPHA)
    session = await client.create_session()
    sid = session.session_id
    call = asyncio.create_task(client.call(sid, "shell", _shell(f"connect 127.0.0.1 {echo.port} hold")))
    await until(lambda: echo.accepted == 1)
    await client.cancel(sid)
    await asyncio.wait_for(echo.closed.wait(), 10)  # the server closed its side of the tunnel
    await asyncio.wait_for(call, 20)
    (record,) = await _records(h, 1)
    assert record["end"] == "cancelled" and record["bytes_out"] == 4
    echo.closed.clear()
    # a background process's tunnel (no call runs any more) ends with the session
    await client.call(
        sid,
        "shell",
        {
            **_shell(f"connect 127.0.0.1 {echo.port} hold"),
            "command": (f"{sys.executable} {CLIENT} connect 127.0.0.1 {echo.port} hold > held.txt 2>&1 &"),
        },
    )
    await until(lambda: echo.accepted == 2)
    await client.close_session(sid)
    await asyncio.wait_for(echo.closed.wait(), 10)
