"""``dispatcher close|cancel|renew|pause|resume``, ``sessions`` and ``plan SESSION show`` against a
live in-process server."""

from __future__ import annotations

import asyncio
import json

import pytest

from dispatcher import cli
from dispatcher.cli.lifecycle import duration, human
from tests.server.conftest import TOKEN_ALPHA, Harness


async def run(harness: Harness, *argv: str) -> int:
    return await asyncio.to_thread(cli.main, [*argv[:1], "--server", harness.target, *argv[1:]])


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)


def test_durations_read_and_print_as_people_write_them() -> None:
    assert [duration(t) for t in ("90", "90s", "10m", "2h", "1d")] == [90, 90, 600, 7200, 86400]
    assert (human(12), human(250), human(3 * 3600 + 300), human(86400 + 7200)) == (
        "12s",
        "4m10s",
        "3h05m",
        "1d02h",
    )
    with pytest.raises(Exception, match="expected a duration"):
        duration("soon")


async def test_sessions_pause_resume_renew_and_plan_show(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    client = harness.client()
    sid = (await client.create_session("w", mode="plan")).session_id
    assert await run(harness, "pause", sid) == 0
    assert "paused" in capsys.readouterr().out
    assert await run(harness, "sessions") == 0
    line = capsys.readouterr().out
    assert sid in line and "paused" in line and "expires in" in line
    assert await run(harness, "resume", sid) == 0
    assert "active" in capsys.readouterr().out
    assert await run(harness, "renew", sid, "2h") == 0
    out = capsys.readouterr().out
    assert "expires in 1h59m" in out or "expires in 2h00m" in out
    assert await run(harness, "sessions", "--json") == 0
    row = json.loads(capsys.readouterr().out.splitlines()[0])
    assert row["state"] == "active" and row["pending_request_ids"] == [] and row["plan"] == []
    assert row["expire_time"] and row["idle_expire_time"] and row["idle_seconds"] is not None
    await client.call(sid, "write_file", {"path": "a.txt", "content": "x"})  # held back as a step
    assert await run(harness, "plan", sid, "show") == 0
    captured = capsys.readouterr()
    assert "1 proposed steps" in captured.err and "write_file" in captured.out
    assert await run(harness, "cancel", sid) == 0
    assert "cancelled" in capsys.readouterr().out


async def test_a_call_that_resumed_its_session_says_so_after_streamed_output(
    harness: Harness, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = (await harness.client().create_session("w")).session_id
    assert await run(harness, "pause", sid) == 0
    capsys.readouterr()
    command = json.dumps({"command": "echo streamed"})
    assert await run(harness, "call", "--session", sid, "shell", command, "--yes") == 0
    out = capsys.readouterr()
    assert "streamed" in out.out
    assert "[sandbox: the session was paused and has been resumed for this call" in out.err, out.err


async def test_close_named_idle_and_all(harness: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    client = harness.client()
    ids = [(await client.create_session(f"w{i}")).session_id for i in range(3)]
    assert await run(harness, "close", ids[0]) == 0
    assert f"closed {ids[0]}" in capsys.readouterr().out
    assert await run(harness, "close", "--idle-for", "1h") == 0  # none has been idle that long
    assert "closed" not in capsys.readouterr().out
    assert await run(harness, "close", "--all") == 1  # not a terminal, no --yes: nothing closed
    assert "add --yes" in capsys.readouterr().err
    assert len(await client.list_sessions()) == 2
    assert await run(harness, "close", "--all", "--yes") == 0
    assert await client.list_sessions() == []
    assert await run(harness, "close", ids[0]) == 1  # already closed: said, not hidden
    assert "NOT_FOUND" in capsys.readouterr().err
