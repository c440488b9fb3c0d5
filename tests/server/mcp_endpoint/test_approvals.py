"""Approvals when the host cannot ask: it declared elicitation but failed the request."""

from __future__ import annotations

import anyio
import mcp_types as mt
from mcp.client.session import ClientRequestContext

from tests.mcp_host import http_session, text_of
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
