"""``dispatcher mcp`` over stdio, driven by the official MCP Python SDK client, against a real server
on loopback whose sessions run in Docker (issue 36): tools with their hints, shell and read_file,
output as progress, a write approved or declined through elicitation, a cancelled call."""

from __future__ import annotations

import anyio
import mcp_types as mt
import pytest

from tests.integration.grpc.mcp_host import Asker, stdio_session, text_of
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, Harness

pytestmark = pytest.mark.docker


async def test_tools_list_and_calls_through_stdio(docker_harness: Harness) -> None:
    (docker_harness.tmp / "ws-alpha" / "default").mkdir(parents=True, exist_ok=True)
    (docker_harness.tmp / "ws-alpha" / "default" / "notes.txt").write_text("first line\n")
    async with stdio_session(docker_harness.target, TOKEN_ALPHA, "--workspace", "default") as mcp:
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

        missing = await mcp.call_tool("read_file", {"path": "nope.txt"})
        assert missing.is_error and "nope.txt" in text_of(missing)

        sessions = await docker_harness.client().list_sessions()
        assert [s.labels.get("dispatcher.mcp") for s in sessions] == ["stdio"]
    # The host closed stdin: the session it created is closed.
    client = docker_harness.client()

    async def closed() -> bool:
        return not await client.list_sessions()

    await until(closed, "the MCP session's dispatcher session to close", timeout=30)


async def test_a_write_is_approved_or_declined_through_elicitation(docker_harness: Harness) -> None:
    answers = iter(
        [
            mt.ElicitResult(action="accept", content={"decision": "allow", "remember": False}),
            mt.ElicitResult(action="decline"),
        ]
    )
    asker = Asker(reply=lambda _p: next(answers))
    ws = docker_harness.tmp / "ws-alpha" / "default"
    async with stdio_session(docker_harness.target, TOKEN_ALPHA, "--mode", "cautious", asker=asker) as mcp:
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


async def test_without_elicitation_the_call_waits_for_another_client(docker_harness: Harness) -> None:
    client = docker_harness.client()
    notes: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append(message or "")

    async with stdio_session(docker_harness.target, TOKEN_ALPHA, "--mode", "cautious") as mcp:
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


async def test_a_cancelled_call_leaves_no_process(docker_harness: Harness) -> None:
    async with stdio_session(docker_harness.target, TOKEN_ALPHA) as mcp:
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
