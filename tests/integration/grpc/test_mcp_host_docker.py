"""The dispatcher as an MCP server, driven by the official MCP Python SDK client against a real
server on loopback whose sessions run in Docker (issue 36): each test runs over ``dispatcher mcp``
(stdio, a subprocess) and over the server's streamable HTTP endpoint. Tools with their hints, shell
and read_file, output as progress, a write approved or declined through elicitation, an approval
given elsewhere first, a cancelled call, the confirmation timeout."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as mt
import pytest
from mcp.client.session import ClientRequestContext

from tests.events import ToolCalled
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import docker_server
from tests.mcp_host import Asker, Host, modern_stdio_client, text_of
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, Harness, base_config, deep_merge
from tests.server.helpers import next_event

pytestmark = pytest.mark.docker

ENDPOINT = {"mcp_endpoint": {"listen": "127.0.0.1:0", "path": "/mcp", "max_sessions_per_tenant": 2}}


def _config(tmp_path: Path, **over: Any) -> dict[str, Any]:
    return deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}, **ENDPOINT, **over})


def _host(harness: Harness, transport: str) -> Host:
    endpoint = harness.server.mcp_endpoint
    assert endpoint is not None
    return Host(transport, harness.target, f"http://127.0.0.1:{endpoint.port}/mcp")


@pytest.fixture
async def served(make_provider: ProviderFactory, tmp_path: Path) -> AsyncIterator[Harness]:
    async with docker_server(make_provider, tmp_path, _config(tmp_path)) as harness:
        yield harness


@pytest.fixture(params=["stdio", "http"])
def host(request: pytest.FixtureRequest, served: Harness) -> Host:
    return _host(served, str(request.param))


async def test_tools_list_and_calls(served: Harness, host: Host) -> None:
    (served.tmp / "ws-alpha" / "default").mkdir(parents=True, exist_ok=True)
    (served.tmp / "ws-alpha" / "default" / "notes.txt").write_text("first line\n")
    async with host.open(TOKEN_ALPHA, workspace="default") as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert {"shell", "read_file", "write_file"} <= set(tools)
        assert tools["read_file"].annotations == mt.ToolAnnotations(
            read_only_hint=True, destructive_hint=False, open_world_hint=False
        )
        assert tools["shell"].annotations is not None and tools["shell"].annotations.destructive_hint
        assert tools["read_file"].input_schema["properties"]["path"]

        read = await mcp.call_tool("read_file", {"path": "notes.txt"})
        assert not read.is_error and "first line" in text_of(read)

        notes: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            notes.append(message or "")

        ran = await mcp.call_tool(
            "shell", {"command": "echo out-$((6*7)); echo err >&2; exit 3"}, progress_callback=on_progress
        )
        assert ran.is_error  # a command that fails is a failed call, the model sees why
        assert "out-42" in text_of(ran)
        assert ran.meta is not None and ran.meta["dispatcher/exit_code"] == 3
        assert any("out-42" in m for m in notes), notes

        # The same session is the one `dispatcher sessions` lists and `dispatcher watch` follows.
        (session,) = await served.client().list_sessions()
        called = await next_event(served.client(), session.session_id, ToolCalled)
        assert called.payload.tool_name == "read_file"

        missing = await mcp.call_tool("read_file", {"path": "nope.txt"})
        assert missing.is_error and "nope.txt" in text_of(missing)

        assert session.labels.get("dispatcher.mcp") == host.transport
    # The host closed stdin, or ended the HTTP session: the session it created is closed.
    client = served.client()

    async def closed() -> bool:
        return not await client.list_sessions()

    await until(closed, "the MCP session's dispatcher session to close", timeout=30)


async def test_a_write_is_approved_or_declined_through_elicitation(served: Harness, host: Host) -> None:
    answers = iter(
        [
            mt.ElicitResult(action="accept", content={"decision": "allow", "remember": False}),
            mt.ElicitResult(action="decline"),
        ]
    )
    asker = Asker(reply=lambda _p: next(answers))
    ws = served.tmp / "ws-alpha" / "default"
    async with host.open(TOKEN_ALPHA, mode="cautious", asker=asker) as mcp:
        done = await mcp.call_tool("write_file", {"path": "approved.txt", "content": "yes\n"})
        assert not done.is_error, text_of(done)
        assert (ws / "approved.txt").read_text() == "yes\n"
        assert len(asker.questions) == 1
        question = asker.questions[0]
        assert "write_file (write)" in question and "approved.txt" in question
        assert "dispatcher approve" in question

        refused = await mcp.call_tool("write_file", {"path": "declined.txt", "content": "no\n"})
        assert refused.is_error and "denied" in text_of(refused).lower()
        assert not (ws / "declined.txt").exists()
        assert len(asker.questions) == 2


async def test_remember_for_this_session_asks_once(served: Harness, host: Host) -> None:
    asker = Asker(
        reply=lambda _p: mt.ElicitResult(action="accept", content={"decision": "allow", "remember": True})
    )
    ws = served.tmp / "ws-alpha" / "default"
    async with host.open(TOKEN_ALPHA, mode="cautious", asker=asker) as mcp:
        for name in ("one.txt", "two.txt"):
            done = await mcp.call_tool("write_file", {"path": name, "content": name})
            assert not done.is_error, text_of(done)
        assert (ws / "two.txt").read_text() == "two.txt"
        assert len(asker.questions) == 1  # the second write ran on the remembered answer


async def test_without_elicitation_the_call_waits_for_another_client(served: Harness, host: Host) -> None:
    client = served.client()
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    async with host.open(TOKEN_ALPHA, mode="cautious") as mcp:
        async with anyio.create_task_group() as tg:
            results: list[mt.CallToolResult] = []

            async def call() -> None:
                results.append(
                    await mcp.call_tool(
                        "write_file", {"path": "other.txt", "content": "x"}, progress_callback=on_progress
                    )
                )

            tg.start_soon(call)
            await until(lambda: any("dispatcher approve" in n for n in notes), "the note on where to answer")
            (session,) = await client.list_sessions()
            (request_id,) = session.pending_request_ids
            assert f"dispatcher approve {session.session_id} {request_id}" in notes[-1]
            applied, _ = await client.resolve_confirmation(session.session_id, request_id, True)
            assert applied
        assert not results[0].is_error, text_of(results[0])


async def test_a_cancelled_call_leaves_no_process(host: Host) -> None:
    async with host.open(TOKEN_ALPHA) as mcp:
        started: list[str] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            started.append(message or "")

        with anyio.move_on_after(60) as scope:
            async with anyio.create_task_group() as tg:

                async def call() -> None:
                    await mcp.call_tool(
                        "shell", {"command": "echo started; sleep 301"}, progress_callback=on_progress
                    )

                tg.start_soon(call)
                await until(lambda: any("started" in m for m in started), "the command to start", timeout=30)
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled
        assert not scope.cancelled_caught

        count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '[s]leep 301'"

        async def gone() -> bool:
            left = await mcp.call_tool("shell", {"command": f"{count}; true"})
            return text_of(left).strip().startswith("0")

        await until(gone, "the cancelled command's process to end", timeout=30, interval=0.5)


async def test_on_2026_07_28_the_approval_is_an_input_required_round_trip(docker_harness: Harness) -> None:
    """stdio only: the HTTP endpoint serves the handshake revisions (see the test below)."""
    answers = iter(
        [
            mt.ElicitResult(action="accept", content={"decision": "allow"}),
            mt.ElicitResult(action="decline"),
        ]
    )
    asker = Asker(reply=lambda _p: next(answers))
    ws = docker_harness.tmp / "ws-alpha" / "default"
    client = modern_stdio_client(docker_harness.target, TOKEN_ALPHA, "--mode", "cautious", asker=asker)
    async with client:
        assert client.protocol_version == "2026-07-28"
        read = await client.call_tool("shell", {"command": "echo modern"})
        assert not read.is_error and "modern" in text_of(read)

        done = await client.call_tool("write_file", {"path": "modern.txt", "content": "yes\n"})
        assert not done.is_error, text_of(done)
        assert (ws / "modern.txt").read_text() == "yes\n"
        assert "write_file (write)" in asker.questions[0]

        refused = await client.call_tool("write_file", {"path": "refused.txt", "content": "no\n"})
        assert refused.is_error and "denied" in text_of(refused).lower()
        assert not (ws / "refused.txt").exists()
        assert len(asker.questions) == 2


async def test_an_answer_given_elsewhere_while_the_host_asks_wins(served: Harness, host: Host) -> None:
    client = served.client()
    asked = anyio.Event()
    release = anyio.Event()

    async def late_decline(context: ClientRequestContext, params: mt.ElicitRequestParams) -> mt.ElicitResult:
        asked.set()
        await release.wait()
        return mt.ElicitResult(action="decline")

    ws = served.tmp / "ws-alpha" / "default"
    async with host.open(TOKEN_ALPHA, mode="cautious", asker=late_decline) as mcp:
        results: list[mt.CallToolResult] = []
        async with anyio.create_task_group() as tg:

            async def call() -> None:
                results.append(await mcp.call_tool("write_file", {"path": "first.txt", "content": "1"}))

            tg.start_soon(call)
            with anyio.fail_after(30):
                await asked.wait()
            (session,) = await client.list_sessions()
            (request_id,) = session.pending_request_ids
            applied, _ = await client.resolve_confirmation(session.session_id, request_id, True)
            assert applied
            await until(lambda: bool(results), "the call to end once approved elsewhere", timeout=30)
            release.set()  # the host's late decline changes nothing
        assert not results[0].is_error, text_of(results[0])
        assert (ws / "first.txt").read_text() == "1"


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_host_that_never_answers_gets_the_confirmation_timeout(
    make_provider: ProviderFactory, tmp_path: Path, transport: str
) -> None:
    data = _config(tmp_path, dispatcher={"confirmation_timeout": 2})
    never = anyio.Event()

    async def silent(context: ClientRequestContext, params: mt.ElicitRequestParams) -> mt.ElicitResult:
        await never.wait()
        raise AssertionError("unreachable")

    async with docker_server(make_provider, tmp_path, data) as harness:
        async with _host(harness, transport).open(TOKEN_ALPHA, mode="cautious", asker=silent) as mcp:
            with anyio.fail_after(60):
                result = await mcp.call_tool("write_file", {"path": "late.txt", "content": "x"})
            assert result.is_error
            assert result.meta is not None and result.meta["dispatcher/error_class"] == "confirmation_timeout"
        never.set()
