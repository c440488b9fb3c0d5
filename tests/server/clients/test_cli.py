"""The ``dispatcher`` CLI's client verbs against a live in-process server (run in a worker thread)."""

from __future__ import annotations

import asyncio
import builtins
import io
import json
import sys
from typing import Any

import pytest

from dispatcher import cli
from tests.events import ToolConfirmationRequested
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness
from tests.server.helpers import next_event, until


async def run(harness: Harness, *argv: str) -> int:
    return await asyncio.to_thread(cli.main, [*argv[:1], "--server", harness.target, *argv[1:]])


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)


async def test_call_prints_result_and_reuses_its_session(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    (harness.tmp / "ws-alpha" / "default").mkdir(parents=True)
    (harness.tmp / "ws-alpha" / "default" / "README.md").write_text("# hello from the tour\n")
    assert await run(harness, "call", "read_file", '{"path": "README.md"}') == 0
    out = capsys.readouterr()
    assert "# hello from the tour" in out.out
    assert "read_file (read) started" in out.err and "completed" in out.err
    assert await run(harness, "call", "shell", '{"command": "echo streamed; exit 3"}') == 1
    out = capsys.readouterr()
    assert out.out.count("streamed") == 1  # streamed live, not printed again with the result
    assert "exit code 3" in out.err and "execution_error" in out.err
    sessions = await harness.client().list_sessions()
    assert len(sessions) == 1 and sessions[0].labels == {"dispatcher.cli": "1"}
    assert await run(harness, "sessions") == 0
    assert sessions[0].session_id in capsys.readouterr().out


async def test_json_output(harness: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    assert await run(harness, "call", "echo", '{"text": "hi"}', "--json", "--id", "t1") == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["kind"] for line in lines] == ["event", "event", "result"]
    assert lines[-1]["content"] == [{"type": "text", "text": "hi"}] and lines[-1]["tool_use_id"] == "t1"
    assert await run(harness, "tools", "--json") == 0
    names = {json.loads(line)["name"] for line in capsys.readouterr().out.splitlines()}
    assert {"read_file", "shell", "echo"} <= names
    assert await run(harness, "tools", "--format", "openai") == 0
    shaped = json.loads(capsys.readouterr().out)
    assert {t["function"]["name"] for t in shaped} == names and {t["type"] for t in shaped} == {"function"}


async def test_yes_approves_confirmations(harness: Harness) -> None:
    assert await run(harness, "call", "write_file", '{"path": "y.txt", "content": "yes"}', "--yes") == 0
    assert (harness.tmp / "ws-alpha" / "default" / "y.txt").read_text() == "yes"


async def test_tty_prompt(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    monkeypatch.setattr(builtins, "input", lambda prompt="": "n")
    assert await run(harness, "call", "write_file", '{"path": "n.txt", "content": "no"}') == 1
    assert not (harness.tmp / "ws-alpha" / "default" / "n.txt").exists()


async def test_approve_from_another_terminal(harness: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    session = await harness.client().create_session("approve-me")
    call = asyncio.create_task(
        run(
            harness,
            "call",
            "write_file",
            '{"path": "a.txt", "content": "ok"}',
            "--session",
            session.session_id,
        )
    )
    request = await next_event(harness.client(), session.session_id, ToolConfirmationRequested)
    request_id = str(request.payload.request_id)
    assert await run(harness, "approve", session.session_id, request_id) == 0
    assert await asyncio.wait_for(call, 20) == 0
    assert await run(harness, "deny", session.session_id, request_id) == 1  # answered before
    assert "not applied" in capsys.readouterr().out


async def test_call_without_a_terminal_says_at_once_that_nobody_can_answer_here(
    harness: Harness, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22 item 8: no terminal on stdin, a prompting policy: the hint comes with the request,
    not after the confirmation timeout, and the call still takes an answer from elsewhere."""
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal
    session = await harness.client().create_session("no-tty")
    call = asyncio.create_task(
        run(
            harness,
            "call",
            "write_file",
            '{"path": "t.txt", "content": "ok"}',
            "--session",
            session.session_id,
        )
    )
    request = await next_event(harness.client(), session.session_id, ToolConfirmationRequested)
    request_id = str(request.payload.request_id)
    err = ""

    def hinted() -> bool:
        nonlocal err
        err += capsys.readouterr().err
        return "nobody can answer here" in err

    await until(hinted, "the hint, before any answer")
    assert f"dispatcher approve {session.session_id} {request_id}" in err and "--yes" in err
    assert not call.done()  # still waiting: a human may answer from another terminal
    assert await run(harness, "approve", session.session_id, request_id) == 0
    assert await asyncio.wait_for(call, 20) == 0


async def test_watch_prints_until_the_session_closes(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    client = harness.client()
    session = await client.create_session()
    await client.call(session.session_id, "echo", {"text": "x"}, tool_use_id="w1")
    watch = asyncio.create_task(run(harness, "watch", session.session_id))
    out = ""

    def replayed() -> bool:
        nonlocal out
        out += capsys.readouterr().out
        return "w1 echo completed" in out

    await until(replayed)
    await client.close_session(session.session_id)
    assert await asyncio.wait_for(watch, 10) == 0
    assert "[1] w1 echo (none) started" in out and "[2] w1 echo completed" in out


@pytest.mark.parametrize(
    ("argv", "code", "env"),
    [
        (["call", "echo", "{not json"], 2, {}),
        (["get-nothing"], 2, {}),
        (["approve", "ses_nope", "r"], 5, {}),
        (["sessions"], 4, {"DISPATCHER_TOKEN": "wrong"}),
        (["call", "echo", '{"text": "x"}', "--workspace", "../escape"], 6, {}),
    ],
)
async def test_exit_codes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, argv: list[str], code: int, env: dict[str, str]
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        assert await run(harness, *argv) == code
    except SystemExit as exc:  # argparse usage errors
        assert exc.code == code


async def test_unreachable_server_is_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    # A port nothing listens on: bind one, learn its number, close it.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args: list[Any] = ["sessions", "--server", f"127.0.0.1:{port}"]
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_BETA)
    assert await asyncio.to_thread(cli.main, args) == 3
