"""The server's MCP endpoint at the HTTP level (config ``mcp_endpoint``), on the local backend: who may
open and use an MCP session, how many a tenant may hold, what ends one, what the URL may ask."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import anyio
import httpx2
import mcp_types as mt
import pytest

from tests.mcp_host import http_session
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness, ServerFactory

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _serve(make_server: ServerFactory, **endpoint: Any) -> tuple[Harness, str]:
    harness = await make_server(mcp_endpoint={"listen": "127.0.0.1:0", "path": "/mcp", **endpoint})
    assert harness.server.mcp_endpoint is not None
    return harness, f"http://127.0.0.1:{harness.server.mcp_endpoint.port}/mcp"


def _headers(token: str | None, **extra: str) -> dict[str, str]:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return {**ACCEPT, **auth, **extra}


async def test_no_token_is_401_and_a_session_is_its_tokens_only(make_server: ServerFactory) -> None:
    harness, url = await _serve(make_server)
    async with httpx2.AsyncClient() as http:
        anonymous = await http.post(url, json=INIT, headers=_headers(None))
        assert anonymous.status_code == 401 and "bearer token" in anonymous.json()["error"]["message"]
        wrong = await http.post(url, json=INIT, headers=_headers("not-a-token"))
        assert wrong.status_code == 401

        opened = await http.post(url, json=INIT, headers=_headers(TOKEN_ALPHA))
        assert opened.status_code == 200
        sid = opened.headers["mcp-session-id"]
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        other = await http.post(url, json=listing, headers=_headers(TOKEN_BETA, **{"Mcp-Session-Id": sid}))
        assert other.status_code == 404  # as if it did not exist: beta learns nothing about alpha's
        (session,) = await harness.client().list_sessions()
        assert session.labels["dispatcher.mcp"] == "http"

        ended = await http.delete(url, headers=_headers(TOKEN_ALPHA, **{"Mcp-Session-Id": sid}))
        assert ended.status_code == 200

    async def closed() -> bool:
        return not await harness.client().list_sessions()

    await until(closed, "the ended MCP session's dispatcher session to close")


async def test_a_tenant_holds_at_most_its_mcp_sessions(make_server: ServerFactory) -> None:
    harness, url = await _serve(make_server, max_sessions_per_tenant=2)
    async with http_session(url, TOKEN_ALPHA), http_session(url, TOKEN_ALPHA):
        async with httpx2.AsyncClient() as http:
            refused = await http.post(url, json=INIT, headers=_headers(TOKEN_ALPHA))
        assert refused.status_code == 429
        assert "max_sessions_per_tenant" in refused.json()["error"]["message"]
        async with http_session(url, TOKEN_BETA) as beta:  # another tenant's count is its own
            assert (await beta.list_tools()).tools
        assert len(await harness.client().list_sessions()) == 2
    async with http_session(url, TOKEN_ALPHA) as again:  # ended ones no longer count
        assert (await again.list_tools()).tools


async def test_the_bound_holds_for_openings_at_once(make_server: ServerFactory) -> None:
    harness, url = await _serve(make_server, max_sessions_per_tenant=2)
    async with httpx2.AsyncClient() as http:
        answers = await asyncio.gather(
            *(http.post(url, json=INIT, headers=_headers(TOKEN_ALPHA)) for _ in range(4))
        )
    assert sorted(a.status_code for a in answers) == [200, 200, 429, 429]
    assert len(await harness.client().list_sessions()) == 2


async def test_an_idle_mcp_session_ends_with_its_dispatcher_session(make_server: ServerFactory) -> None:
    harness, url = await _serve(make_server, idle_timeout_seconds=1)
    async with httpx2.AsyncClient() as http:
        opened = await http.post(url, json=INIT, headers=_headers(TOKEN_ALPHA))
        assert opened.status_code == 200
        sid = opened.headers["mcp-session-id"]
        assert len(await harness.client().list_sessions()) == 1

        async def closed() -> bool:
            return not await harness.client().list_sessions()

        await until(closed, "the idle MCP session's dispatcher session to close", timeout=20)
        late = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
            headers=_headers(TOKEN_ALPHA, **{"Mcp-Session-Id": sid}),
        )
        assert late.status_code == 404


async def test_keep_sessions_leaves_the_dispatcher_session_open(make_server: ServerFactory) -> None:
    harness, url = await _serve(make_server, keep_sessions=True)
    async with http_session(url, TOKEN_ALPHA, workspace="kept"):
        pass
    (kept,) = await harness.client().list_sessions()
    assert kept.workspace == "kept"
    async with http_session(url, TOKEN_ALPHA, session=kept.session_id) as attached:
        listed = await attached.list_resources()
        assert {str(r.uri) for r in listed.resources} == {
            f"dispatcher://sessions/{kept.session_id}/plan",
            f"dispatcher://sessions/{kept.session_id}/staged",
        }
    assert [s.session_id for s in await harness.client().list_sessions()] == [kept.session_id]


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("?colour=red", "unknown query parameter(s) colour"),
        ("?session=s_1&mode=cautious", "not with session="),
        ("?tools=", "tools= names no tool"),
        ("?mode=nonsense", "unknown approval mode 'nonsense'"),
        ("?session=s_nope", "NOT_FOUND"),
    ],
)
async def test_a_bad_url_is_refused_with_what_to_fix(
    make_server: ServerFactory, query: str, said: str
) -> None:
    harness, url = await _serve(make_server)
    async with httpx2.AsyncClient() as http:
        refused = await http.post(url + query, json=INIT, headers=_headers(TOKEN_ALPHA))
    assert refused.status_code in (400, 404), refused.text
    assert said in refused.json()["error"]["message"]
    assert not await harness.client().list_sessions()


async def test_a_2026_07_28_request_is_told_which_revisions_this_endpoint_serves(
    make_server: ServerFactory,
) -> None:
    _, url = await _serve(make_server)
    async with httpx2.AsyncClient() as http:
        modern = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}},
            headers=_headers(TOKEN_ALPHA, **{"MCP-Protocol-Version": "2026-07-28"}),
        )
    assert modern.status_code == 400
    error = modern.json()["error"]
    assert error["code"] == mt.UNSUPPORTED_PROTOCOL_VERSION
    assert "2025-11-25" in error["data"]["supported"] and "2026-07-28" not in error["data"]["supported"]


async def test_a_body_over_the_servers_request_limit_is_refused_unread(make_server: ServerFactory) -> None:
    harness, url = await _serve(make_server)
    limit = harness.server.config.server.max_request_bytes
    huge = b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "' + b"x" * limit + b'"}}'
    async with httpx2.AsyncClient() as http:
        refused = await http.post(url, content=huge, headers=_headers(TOKEN_ALPHA))
    assert refused.status_code == 413


async def test_the_server_stops_while_a_host_holds_a_session(make_server: ServerFactory) -> None:
    """A host's open session (its SSE stream included) does not hold the server's stop up."""
    harness, url = await _serve(make_server)
    stopping: list[asyncio.Task[None]] = []
    with contextlib.suppress(Exception, BaseExceptionGroup):  # the host sees its server go away
        async with http_session(url, TOKEN_ALPHA) as mcp:
            await mcp.list_tools()
            stopping.append(asyncio.create_task(harness.server.stop(grace=1)))
            with anyio.fail_after(20):
                await asyncio.shield(stopping[0])
    with anyio.fail_after(20):
        await stopping[0]
    assert harness.server.mcp_endpoint is not None and not harness.server.mcp_endpoint.sessions_of("alpha")
