"""MCP servers as tools, through the real gRPC server: a small SDK-written server run on the host.

The fixture server (tests/server/mcp_server_fixture.py) leaves marker files so a test can see a
call start inside it and the SDK cancel it on ``notifications/cancelled``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.dispatcher import Decision
from dispatcher.core.types import ImageBlock, SideEffect
from tests.events import ToolConfirmationRequested
from tests.server.conftest import Harness, ServerFactory
from tests.server.helpers import next_event, text_of, until

REPO = Path(__file__).resolve().parents[3]


def fixture_server(markers: Path, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.server.mcp_server_fixture"],
        "env": {"PYTHONPATH": str(REPO), "MCP_FIXTURE_DIR": str(markers)},
        "cancel_grace_seconds": 1,
        **extra,
    }


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    path = tmp_path / "markers"
    path.mkdir()
    return path


async def start(make_server: ServerFactory, markers: Path, **extra: Any) -> Harness:
    server = fixture_server(
        markers,
        tools={"quick": {"side_effect": "read"}, "pixel": {"side_effect": "none"}},
        **extra,
    )
    return await make_server(mcp_servers={"fx": server})


def _pid_of(markers: Path, tag: str) -> int:
    return int((markers / f"{tag}.started").read_text())


async def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_tools_are_listed_with_the_configured_side_effects(
    make_server: ServerFactory, markers: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="dispatcher.mcp")
    h = await start(make_server, markers)
    agent = h.client()
    session = await agent.create_session()
    tools = {t.name: t for t in await agent.list_tools(session.session_id)}
    assert tools["mcp_fx_quick"].side_effect is SideEffect.READ
    assert tools["mcp_fx_pixel"].side_effect is SideEffect.NONE
    assert tools["mcp_fx_slow"].side_effect is SideEffect.EXECUTE  # not listed: the server default
    assert tools["mcp_fx_quick"].input_schema["required"] == ["text"]
    # The description is the server's, escaped: no raw control character reaches a client.
    assert "\x1b" not in tools["mcp_fx_quick"].description and "\\x1b" in tools["mcp_fx_quick"].description
    # An optional argument makes anyOf: outside the subset, skipped with a warning naming it.
    assert "mcp_fx_maybe" not in tools
    assert any("mcp_fx_maybe" in r.getMessage() and "subset" in r.getMessage() for r in caplog.records)


async def test_a_call_works_and_errors_and_images_come_back(
    make_server: ServerFactory, markers: Path
) -> None:
    h = await start(make_server, markers)
    agent = h.client()
    session = await agent.create_session()
    result = await agent.call(session.session_id, "mcp_fx_quick", {"text": "hi"})
    assert not result.is_error and text_of(result) == "quick:hi"
    assert result.metadata["mcp_server"] == "fx"
    bad = await agent.call(session.session_id, "mcp_fx_quick", {"text": 3})
    assert str(bad.error_class) == "validation_error"  # the schema is checked before the server sees it
    failed = await agent.call(session.session_id, "mcp_fx_broken", {"message": "boom"}, tool_use_id="b")
    assert failed.is_error and str(failed.error_class) == "execution_error"
    assert "broken" in text_of(failed)  # the SDK server reports the failure, not its exception text
    image = await agent.call(session.session_id, "mcp_fx_pixel", {})
    assert not image.is_error
    assert any(isinstance(b, ImageBlock) and b.media_type == "image/png" for b in image.content)


async def test_a_write_class_mcp_tool_asks_for_confirmation(
    make_server: ServerFactory, markers: Path
) -> None:
    server = fixture_server(markers, tools={"quick": {"side_effect": "write"}})
    h = await make_server(mcp_servers={"fx": server})
    agent = h.client()  # alpha: WRITE prompts
    session = await agent.create_session()
    call = asyncio.create_task(agent.call(session.session_id, "mcp_fx_quick", {"text": "ok?"}))
    request = await next_event(agent, session.session_id, ToolConfirmationRequested)
    assert request.payload.tool_name == "mcp_fx_quick"
    assert request.payload.side_effect is SideEffect.WRITE or str(request.payload.side_effect) in (
        "write",
        "WRITE",
        "SIDE_EFFECT_WRITE",
    )
    await agent.resolve_confirmation(session.session_id, str(request.payload.request_id), Decision.DENY)
    result = await asyncio.wait_for(call, 20)
    assert str(result.error_class) == "user_denied"


async def test_always_prompt_asks_even_when_the_class_runs(make_server: ServerFactory, markers: Path) -> None:
    server = fixture_server(markers, tools={"quick": {"side_effect": "read", "always_prompt": True}})
    h = await make_server(mcp_servers={"fx": server})
    agent = h.client()
    session = await agent.create_session()
    call = asyncio.create_task(agent.call(session.session_id, "mcp_fx_quick", {"text": "x"}))
    request = await next_event(agent, session.session_id, ToolConfirmationRequested)
    await agent.resolve_confirmation(session.session_id, str(request.payload.request_id), Decision.ALLOW)
    assert text_of(await asyncio.wait_for(call, 20)) == "quick:x"


async def test_a_timeout_cancels_the_request_on_the_server(make_server: ServerFactory, markers: Path) -> None:
    h = await start(make_server, markers, timeout_seconds=0.5)
    agent = h.client()  # alpha: EXECUTE runs without asking
    session = await agent.create_session()
    result = await agent.call(session.session_id, "mcp_fx_slow", {"seconds": 60, "tag": "t"})
    assert str(result.error_class) == "timeout"
    await until(lambda: (markers / "t.cancelled").exists())  # the server got notifications/cancelled
    again = await agent.call(session.session_id, "mcp_fx_quick", {"text": "after"})
    assert text_of(again) == "quick:after"


async def test_cancellation_reaches_the_server(make_server: ServerFactory, markers: Path) -> None:
    h = await start(make_server, markers)
    agent = h.client()
    session = await agent.create_session()
    call = asyncio.create_task(agent.call(session.session_id, "mcp_fx_slow", {"seconds": 60, "tag": "c"}))
    await until(lambda: (markers / "c.started").exists(), timeout=20)
    pid = _pid_of(markers, "c")
    await agent.cancel(session.session_id)
    result = await asyncio.wait_for(call, 20)
    assert str(result.error_class) == "cancelled"
    await until(lambda: (markers / "c.cancelled").exists())
    assert await _alive(pid)  # it honoured the cancellation: kept, not killed
    again = await agent.call(session.session_id, "mcp_fx_pid", {})
    assert text_of(again) == str(pid)


async def test_a_server_ignoring_cancellation_is_killed_and_restarted(
    make_server: ServerFactory, markers: Path
) -> None:
    h = await start(make_server, markers)
    agent = h.client()
    session = await agent.create_session()
    call = asyncio.create_task(agent.call(session.session_id, "mcp_fx_stuck", {"seconds": 60, "tag": "s"}))
    await until(lambda: (markers / "s.started").exists(), timeout=20)
    pid = _pid_of(markers, "s")
    await agent.cancel(session.session_id)
    result = await asyncio.wait_for(call, 20)
    assert str(result.error_class) == "cancelled"
    await until(lambda: not _exists(pid))  # no answer to a ping within the grace: killed
    again = await agent.call(session.session_id, "mcp_fx_pid", {})
    assert not again.is_error and text_of(again) != str(pid)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_killing_the_server_mid_call_fails_that_call_and_the_next_works(
    make_server: ServerFactory, markers: Path
) -> None:
    h = await start(make_server, markers)
    agent = h.client()
    session = await agent.create_session()
    call = asyncio.create_task(agent.call(session.session_id, "mcp_fx_slow", {"seconds": 60, "tag": "k"}))
    await until(lambda: (markers / "k.started").exists(), timeout=20)
    os.kill(_pid_of(markers, "k"), signal.SIGKILL)
    result = await asyncio.wait_for(call, 20)
    assert result.is_error and str(result.error_class) == "execution_error"
    assert "died during the call" in text_of(result) and "'fx'" in text_of(result)
    again = await agent.call(session.session_id, "mcp_fx_quick", {"text": "back"})
    assert not again.is_error and text_of(again) == "quick:back"


async def test_the_server_is_stopped_with_the_dispatcher(make_server: ServerFactory, markers: Path) -> None:
    h = await start(make_server, markers)
    agent = h.client()
    session = await agent.create_session()
    pid = int(text_of(await agent.call(session.session_id, "mcp_fx_pid", {})))
    await h.server.stop(grace=1)
    assert not _exists(pid)


async def test_run_sandbox_gives_each_session_its_own_process_in_its_workspace(
    make_server: ServerFactory, markers: Path
) -> None:
    # The local backend (no container): the process runs in the session's workspace directory.
    h = await make_server(mcp_servers={"fx": fixture_server(markers, run="sandbox")})
    agent = h.client()
    one, two = await agent.create_session("one"), await agent.create_session("two")
    pid_one, cwd_one = text_of(await agent.call(one.session_id, "mcp_fx_where", {})).split(" ", 1)
    pid_two, cwd_two = text_of(await agent.call(two.session_id, "mcp_fx_where", {})).split(" ", 1)
    assert pid_one != pid_two
    assert Path(cwd_one) == Path(one.workspace_path) and Path(cwd_two) == Path(two.workspace_path)
    assert text_of(await agent.call(one.session_id, "mcp_fx_where", {})).startswith(pid_one + " ")
    await agent.close_session(one.session_id)
    await h.server.stop(grace=1)
    assert not _exists(int(pid_one)) and not _exists(int(pid_two))


async def test_closing_a_session_stops_its_run_sandbox_process_and_only_its(
    make_server: ServerFactory, markers: Path
) -> None:
    # The MCP servers listen to the session registry: a close reaches the session's process even
    # where no container goes with it (the local backend runs it on the host).
    h = await make_server(mcp_servers={"fx": fixture_server(markers, run="sandbox")})
    agent = h.client()
    one, two = await agent.create_session("one"), await agent.create_session("two")
    pid_one = int(text_of(await agent.call(one.session_id, "mcp_fx_where", {})).split(" ", 1)[0])
    pid_two = int(text_of(await agent.call(two.session_id, "mcp_fx_where", {})).split(" ", 1)[0])
    await agent.close_session(one.session_id)
    await until(lambda: not _exists(pid_one), "the closed session's MCP process to stop")
    assert _exists(pid_two)
    assert not (await agent.call(two.session_id, "mcp_fx_where", {})).is_error


async def test_a_message_over_the_limit_ends_the_server_and_fails_the_call(
    make_server: ServerFactory, markers: Path
) -> None:
    h = await start(make_server, markers)
    agent = h.client()
    session = await agent.create_session()
    pid = text_of(await agent.call(session.session_id, "mcp_fx_pid", {}))
    result = await agent.call(session.session_id, "mcp_fx_huge", {"mib": 17})
    assert str(result.error_class) == "execution_error" and "longer than its limit" in text_of(result)
    assert not _exists(int(pid))
    again = await agent.call(session.session_id, "mcp_fx_huge", {"mib": 1})
    # 1 MiB fits the transport; the pipeline cuts it to the result budget (head + tail) as for any tool.
    assert not again.is_error and 0 < len(text_of(again)) < 100_000
