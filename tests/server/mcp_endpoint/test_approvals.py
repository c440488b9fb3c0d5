"""Approvals over the HTTP endpoint: a host that cannot ask, and the SDK's default client."""

from __future__ import annotations

import anyio
import mcp_types as mt
from mcp.client.client import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.mcp_host import Asker, http_session, text_of
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, ServerFactory


async def test_a_host_that_fails_to_ask_gets_the_note_and_another_answer_counts(
    make_server: ServerFactory,
) -> None:
    harness = await make_server(mcp_endpoint={"listen": "127.0.0.1:0"})
    assert harness.server.mcp_endpoint is not None
    url = f"http://127.0.0.1:{harness.server.mcp_endpoint.port}/mcp"

    async def broken(context: ClientRequestContext, params: mt.ElicitRequestParams) -> mt.ErrorData:
        return mt.ErrorData(code=mt.INTERNAL_ERROR, message="no UI here")

    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    client = harness.client()
    async with http_session(url, TOKEN_ALPHA, broken, mode="cautious") as mcp:
        results: list[mt.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                arguments = {"path": "x.txt", "content": "x"}
                results.append(await mcp.call_tool("write_file", arguments, progress_callback=on_progress))

            tg.start_soon(call)
            await until(lambda: any("dispatcher approve" in n for n in notes), "the note on where to answer")
            (session,) = await client.list_sessions()
            (request_id,) = session.pending_request_ids
            applied, _ = await client.resolve_confirmation(session.session_id, request_id, True)
            assert applied
    assert not results[0].is_error, text_of(results[0])


async def test_an_sdk_client_in_auto_mode_falls_back_to_the_handshake(make_server: ServerFactory) -> None:
    """The SDK's default ``Client`` probes 2026-07-28 first; the endpoint's answer sends it to
    initialize, and approvals then come as elicitation/create."""
    harness = await make_server(mcp_endpoint={"listen": "127.0.0.1:0"})
    assert harness.server.mcp_endpoint is not None
    url = f"http://127.0.0.1:{harness.server.mcp_endpoint.port}/mcp?mode=cautious"
    asker = Asker()
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN_ALPHA}"})
    async with (
        http,
        Client(streamable_http_client(url, http_client=http), elicitation_callback=asker) as client,
    ):
        assert client.protocol_version == "2025-11-25"
        done = await client.call_tool("write_file", {"path": "auto.txt", "content": "ok"})
        assert not done.is_error, text_of(done)
        assert len(asker.questions) == 1
    assert (harness.tmp / "ws-alpha" / "default" / "auto.txt").read_text() == "ok"
