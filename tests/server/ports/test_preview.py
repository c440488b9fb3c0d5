"""The preview gateway against a live in-process server with the local sandbox: an HTTP server the
model started in its sandbox, reached through ``http://{port}-{session}.localhost``: the token by
header, or once by query then by its HttpOnly cookie; refusals (no token, a wrong one, another
session's, after ClosePort, after expiry, a request that is not a path, an ambiguous one); a
large download byte-identical; a WebSocket echoing 1,000 messages in order; audit and metrics.

The test's client connects to the gateway's loopback port and names the preview host in ``Host``,
as a browser resolving ``*.localhost`` does.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from dispatcher import cli
from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.config import hash_token
from dispatcher.server.preview import gateway
from dispatcher.server.preview.gateway import COOKIE, HEADER
from dispatcher.server.preview.ports import MAX_PORTS_PER_SESSION
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness, ServerFactory
from tests.server.helpers import until
from tests.server.ports.test_connect_port import PORT_SERVER

PREVIEW = {"preview": {"listen": "127.0.0.1:0", "domain": "localhost"}}


@pytest.fixture
async def gw(make_server: ServerFactory, tmp_path: Path) -> Harness:
    return await make_server(audit_log=str(tmp_path / "audit.jsonl"), **PREVIEW)


async def _site(harness: Harness, workspace: str = "site") -> tuple[AsyncDispatcherClient, str, int]:
    client = harness.client()
    sid = (await client.create_session(workspace)).session_id
    root = harness.tmp / "ws-alpha" / workspace
    (root / "index.html").write_text("<html><body>hello from the sandbox</body></html>")
    started = await client.call(
        sid, "shell", {"command": f"python3 {PORT_SERVER} http http.port", "background": True}
    )
    assert not started.is_error, started
    await until((root / "http.port").exists, "the server to listen", timeout=20)
    return client, sid, int((root / "http.port").read_text())


def _base(harness: Harness) -> str:
    assert harness.server.previews is not None
    return f"http://127.0.0.1:{harness.server.previews.listen_port}"


async def _get(
    harness: Harness, host: str, path: str = "/", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as http,
        http.get(
            _base(harness) + path, headers={"Host": host, **(headers or {})}, allow_redirects=False
        ) as response,
    ):
        return response.status, dict(response.headers), await response.read()


async def test_the_token_by_header_or_once_by_query_then_by_cookie(gw: Harness, tmp_path: Path) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    host = f"{port}-{sid}.localhost"
    assert opened.url == f"http://{host}:{gw.server.previews.listen_port}/"  # type: ignore[union-attr]
    assert opened.token and opened.expire_time is None

    status, _, body = await _get(gw, host)
    assert status == 401 and HEADER.encode() in body
    status, _, _ = await _get(gw, host, headers={HEADER: "wrong"})
    assert status == 401
    status, _, body = await _get(gw, host, "/index.html", {HEADER: opened.token})
    assert status == 200 and body == b"<html><body>hello from the sandbox</body></html>"

    status, headers, _ = await _get(gw, host, f"/index.html?a=1&token={opened.token}")
    assert status == 303 and headers["Location"] == "/index.html?a=1"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}={opened.token};") and "HttpOnly" in cookie and "Domain" not in cookie
    status, _, body = await _get(gw, host, "/index.html", {"Cookie": f"{COOKIE}={opened.token}"})
    assert status == 200 and b"hello from the sandbox" in body
    # A wrong token by one way never falls back to a good one by another.
    status, _, _ = await _get(gw, host, "/", {HEADER: "wrong", "Cookie": f"{COOKIE}={opened.token}"})
    assert status == 401

    audit = (tmp_path / "audit.jsonl").read_text()
    assert opened.token not in audit
    reasons = [json.loads(line).get("reason") for line in audit.splitlines()]
    assert "no_token" in reasons and "wrong_token_header" in reasons


async def test_closed_expired_and_other_sessions_ports_are_refused(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    _, other, other_port = await _site(gw, "other")
    opened = await client.open_port(sid, port)
    theirs = await client.open_port(other, other_port)
    token = {HEADER: opened.token}
    # This session's token on the other session's port: refused.
    assert (await _get(gw, f"{other_port}-{other}.localhost", "/", token))[0] == 401
    assert (await _get(gw, f"{other_port}-{other}.localhost", "/", {HEADER: theirs.token}))[0] == 200
    # Another tenant cannot open or close it.
    with pytest.raises(RequestFailed) as err:
        await gw.client(TOKEN_BETA).open_port(sid, port)
    assert err.value.code == "NOT_FOUND"
    await client.close_port(sid, port)
    status, _, body = await _get(gw, f"{port}-{sid}.localhost", "/", token)
    assert status == 404 and b"not open" in body
    with pytest.raises(RequestFailed) as err:
        await client.close_port(sid, port)
    assert err.value.code == "NOT_FOUND"
    # Expiry.
    opened = await client.open_port(sid, port, expires_in_seconds=1)
    assert opened.expire_time is not None
    assert (await _get(gw, f"{port}-{sid}.localhost", "/", {HEADER: opened.token}))[0] == 200

    async def expired() -> bool:
        return (await _get(gw, f"{port}-{sid}.localhost", "/", {HEADER: opened.token}))[0] == 404

    await until(expired, "the URL to expire", timeout=10, interval=0.2)
    # Not a preview host, or another domain: 404, nothing reached.
    assert (await _get(gw, "localhost", "/", token))[0] == 404
    assert (await _get(gw, f"{port}-{sid}.localhost.evil.example", "/", token))[0] == 404
    # Nothing listens on an opened port: a clear 502.
    idle = await client.open_port(sid, 1)
    status, _, body = await _get(gw, f"1-{sid}.localhost", "/", {HEADER: idle.token})
    assert status == 502 and b"Nothing answers on port 1" in body


async def test_ambiguous_requests_are_refused_before_the_sandbox(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    host = f"{port}-{sid}.localhost"
    raw = [
        f"POST / HTTP/1.1\r\nHost: {host}\r\n{HEADER}: {opened.token}\r\nContent-Length: 3\r\n"
        "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        f"GET / HTTP/1.1\r\nHost: {host}\r\n{HEADER}: {opened.token}\r\nX: a\r\n b\r\n\r\n",
        f"GET / HTTP/1.1\r\nHost: {host}\r\nHost: {host}\r\n{HEADER}: {opened.token}\r\n\r\n",
        f"GET / HTTP/1.1\r\nHost: {host}\r\n{HEADER}: {opened.token}\r\nX: {'a' * 20000}\r\n\r\n",
        f"GET http://127.0.0.1:{gw.server.port}/ HTTP/1.1\r\nHost: {host}\r\n{HEADER}: {opened.token}\r\n\r\n",
    ]
    assert gw.server.previews is not None
    for request in raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.server.previews.listen_port)
        writer.write(request.encode())
        status_line = await reader.readline()
        writer.close()
        assert status_line.split()[1] == b"400", (request[:60], status_line)


async def test_twenty_megabytes_download_byte_identical(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    blob = os.urandom(1 << 20) * 20
    (gw.tmp / "ws-alpha" / "site" / "blob.bin").write_bytes(blob)
    opened = await client.open_port(sid, port)
    status, headers, body = await _get(gw, f"{port}-{sid}.localhost", "/blob.bin", {HEADER: opened.token})
    assert status == 200 and headers["Content-Length"] == str(len(blob)) and body == blob


async def test_a_websocket_echoes_a_thousand_messages_in_order(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            _base(gw) + "/ws", headers={"Host": f"{port}-{sid}.localhost", HEADER: opened.token}
        ) as ws,
    ):
        for i in range(1000):
            await ws.send_str(f"message {i}")
        got = [(await ws.receive_str()) for _ in range(1000)]
        await ws.send_bytes(b"\x00" * 100_000)
        assert await ws.receive_bytes() == b"\x00" * 100_000
    assert got == [f"message {i}" for i in range(1000)]


async def test_the_session_lists_its_open_ports_without_tokens(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port, expires_in_seconds=3600)
    await client.open_port(sid, 1)
    stub = pb_grpc.ToolDispatcherStub(client._channel)
    session = (
        await stub.GetSession(
            pb.GetSessionRequest(session_id=sid), metadata=[("authorization", f"Bearer {TOKEN_ALPHA}")]
        )
    ).session
    assert [(p.port, p.url, p.public) for p in session.open_ports] == [
        (1, f"http://1-{sid}.localhost:{gw.server.previews.listen_port}/", False),  # type: ignore[union-attr]
        (port, opened.url, False),
    ]
    assert session.open_ports[1].HasField("expire_time") and not session.open_ports[0].HasField("expire_time")
    assert opened.token not in str(session)
    await client.close_port(sid, 1)
    session = (
        await stub.GetSession(
            pb.GetSessionRequest(session_id=sid), metadata=[("authorization", f"Bearer {TOKEN_ALPHA}")]
        )
    ).session
    assert [p.port for p in session.open_ports] == [port]
    info = await client.get_session(sid)  # the client's view: the same, as PreviewPort
    assert [(p.port, p.url, p.public) for p in info.open_ports] == [(port, opened.url, False)]
    assert info.open_ports[0].expire_time is not None


async def test_a_request_to_a_paused_session_resumes_it(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    assert (await client.pause_session(sid)).paused
    status, _, body = await _get(gw, f"{port}-{sid}.localhost", "/index.html", {HEADER: opened.token})
    assert status == 200 and b"hello from the sandbox" in body
    assert not (await client.get_session(sid)).paused


async def test_closing_the_session_closes_its_ports(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    await client.close_session(sid)
    status, _, _ = await _get(gw, f"{port}-{sid}.localhost", "/", {HEADER: opened.token})
    assert status == 404


async def test_public_ports_only_where_the_config_allows(make_server: ServerFactory) -> None:
    harness = await make_server(preview={**PREVIEW["preview"], "allow_public": ["beta"]})
    client, sid, port = await _site(harness)
    with pytest.raises(RequestFailed) as err:
        await client.open_port(sid, port, public=True)
    assert err.value.code == "FAILED_PRECONDITION" and "allow_public" in err.value.details
    beta = harness.client(TOKEN_BETA)
    bsid = (await beta.create_session("b")).session_id
    opened = await beta.open_port(bsid, port, public=True)
    assert opened.token == ""


async def test_without_a_gateway_open_port_says_how_to_get_one(harness: Harness) -> None:
    client = harness.client()
    sid = (await client.create_session("x")).session_id
    with pytest.raises(RequestFailed) as err:
        await client.open_port(sid, 8000)
    assert err.value.code == "FAILED_PRECONDITION" and "preview.listen" in err.value.details


async def test_dispatcher_preview_prints_the_url(
    gw: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)
    _, sid, port = await _site(gw)
    argv = ["preview", "--server", gw.target, sid, str(port), "--expires", "2h"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    url = capsys.readouterr().out.strip()
    assert url.startswith(f"http://{port}-{sid}.localhost:") and "?token=" in url
    status, headers, _ = await _get(gw, f"{port}-{sid}.localhost", "/" + url.split("/", 3)[3])
    assert status == 303 and COOKIE in headers["Set-Cookie"]
    assert (
        await asyncio.to_thread(cli.main, ["preview", "--server", gw.target, sid, str(port), "--close"]) == 0
    )
    assert (await _get(gw, f"{port}-{sid}.localhost", "/" + url.split("/", 3)[3]))[0] == 404


async def test_the_connection_bound_gives_a_503_page_and_an_idle_websocket_is_cut(
    make_server: ServerFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = {
        "id": "alpha",
        "token_sha256": [hash_token(TOKEN_ALPHA)],
        "workspace_root": str(tmp_path / "ws-alpha"),
        "tool_confirmation": {"default": {"EXECUTE": "auto"}},
        "quotas": {"max_port_connections_per_session": 1},
    }
    harness = await make_server(tenants=[tenant], **PREVIEW)
    client, sid, port = await _site(harness)
    opened = await client.open_port(sid, port)
    host = {"Host": f"{port}-{sid}.localhost", HEADER: opened.token}
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(_base(harness) + "/ws", headers=host) as ws:
            await ws.send_str("held")
            assert await ws.receive_str() == "held"
            status, _, body = await _get(harness, host["Host"], "/index.html", {HEADER: opened.token})
            assert status == 503 and b"max_port_connections_per_session" in body
        await until(lambda: _ok(harness, host["Host"], opened.token), "the slot to free up")
        monkeypatch.setattr(gateway, "IDLE_SECONDS", 0.5)
        async with http.ws_connect(_base(harness) + "/ws", headers=host) as ws:
            message = await ws.receive(timeout=30)  # nothing moves: the gateway cuts it
            assert message.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            )


async def _ok(harness: Harness, host: str, token: str) -> bool:
    return (await _get(harness, host, "/index.html", {HEADER: token}))[0] == 200


@pytest.mark.parametrize(
    "request_line",
    [
        "CONNECT 127.0.0.1:22 HTTP/1.1",
        "OPTIONS * HTTP/1.1",
        "GET http://127.0.0.1:22/ HTTP/1.1",
        "GET //127.0.0.1:22/ HTTP/1.1",
    ],
)
async def test_no_request_line_reaches_another_address(gw: Harness, request_line: str) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    assert gw.server.previews is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.server.previews.listen_port)
    writer.write(
        f"{request_line}\r\nHost: {port}-{sid}.localhost\r\n{HEADER}: {opened.token}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    writer.close()
    status = int(head.split()[1])
    # Refused, or (the scheme-relative path) passed as a path to the sandbox's own server, which
    # finds no such file: never a connection anywhere else.
    assert status in (400, 404), head


async def test_uploads_with_a_length_or_chunked_arrive_whole(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    body = os.urandom(1 << 20) * 20
    want = f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
    headers = {"Host": f"{port}-{sid}.localhost", HEADER: opened.token}

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 1 << 20):
            yield body[i : i + (1 << 20)]

    async with aiohttp.ClientSession() as http:
        async with http.post(_base(gw) + "/upload", data=io.BytesIO(body), headers=headers) as response:
            assert response.status == 200 and await response.read() == want
        async with http.post(_base(gw) + "/upload", data=chunks(), headers=headers) as response:
            assert response.status == 200 and await response.read() == want


async def test_no_log_line_carries_a_token(gw: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    host = f"{port}-{sid}.localhost"
    assert (await _get(gw, host, f"/index.html?token={opened.token}"))[0] == 303
    assert (await _get(gw, host, "/index.html", {HEADER: opened.token}))[0] == 200
    assert (await _get(gw, host, "/index.html?token=wrong-token-value"))[0] == 401
    assert caplog.records, "the server logs something at DEBUG: the check looks at real lines"
    text = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert opened.token not in text and "wrong-token-value" not in text


async def test_events_stream_as_they_come_and_close_port_cuts_the_stream(gw: Harness) -> None:
    client, sid, port = await _site(gw)
    opened = await client.open_port(sid, port)
    headers = {"Host": f"{port}-{sid}.localhost", HEADER: opened.token}
    async with (
        aiohttp.ClientSession() as http,
        http.get(_base(gw) + "/ticks", headers=headers) as response,
    ):
        assert response.headers["Content-Type"] == "text/event-stream"
        first = await response.content.readuntil(b"\n\n")
        second = await response.content.readuntil(b"\n\n")
        assert (first, second) == (b"data: tick 0\n\n", b"data: tick 1\n\n")  # before the end
        await client.close_port(sid, port)
        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError)):
            async with asyncio.timeout(30):
                while await response.content.read(1 << 16):
                    pass


async def test_preview_requests_are_metered(make_server: ServerFactory) -> None:
    harness = await make_server(metrics={"listen": "127.0.0.1:0"}, **PREVIEW)
    metrics = harness.server.observability.metrics
    assert metrics is not None
    client, sid, port = await _site(harness)
    opened = await client.open_port(sid, port)
    idle = await client.open_port(sid, 1)
    status, _, body = await _get(harness, f"{port}-{sid}.localhost", "/index.html", {HEADER: opened.token})
    assert status == 200
    assert (await _get(harness, f"1-{sid}.localhost", "/", {HEADER: idle.token}))[0] == 502

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, {"tenant": "alpha", **labels}) or 0.0

    assert sample("dispatcher_preview_connections_total", outcome="closed") == 1
    assert sample("dispatcher_preview_connections_total", outcome="refused") == 1
    assert sample("dispatcher_preview_bytes_total", direction="out") == len(body)


async def test_a_session_has_at_most_its_bound_of_open_ports(gw: Harness) -> None:
    client = gw.client()
    sid = (await client.create_session("bound")).session_id
    for port in range(1, MAX_PORTS_PER_SESSION + 1):
        await client.open_port(sid, port)
    with pytest.raises(RequestFailed) as err:
        await client.open_port(sid, 9999)
    assert err.value.code == "RESOURCE_EXHAUSTED" and "close one first" in str(err.value)
    await client.open_port(sid, 1)  # reopening an open one is not one more
    await client.close_port(sid, 2)
    await client.open_port(sid, 9999)  # a closed one makes room
    assert len((await client.get_session(sid)).open_ports) == MAX_PORTS_PER_SESSION
