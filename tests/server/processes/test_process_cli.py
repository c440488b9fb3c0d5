"""``dispatcher ps``, ``logs`` and ``kill``, and the blocking client's process methods, against a
live in-process server (the CLI and the client run in a worker thread)."""

from __future__ import annotations

import asyncio
import json

import pytest

from dispatcher import cli
from dispatcher.client import DispatcherClient, OutputChunk, ProcessInfo, ProcessTruncated, RequestFailed
from tests.server.conftest import TOKEN_ALPHA
from tests.server.helpers import until
from tests.server.processes.conftest import ProcHarness
from tests.server.processes.memory_table import RING_BYTES


async def run(procs: ProcHarness, *argv: str) -> int:
    return await asyncio.to_thread(cli.main, [*argv[:1], "--server", procs.harness.target, *argv[1:]])


@pytest.fixture(autouse=True)
def _token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)


async def _session(procs: ProcHarness, *process_ids: str) -> str:
    sid = (await procs.harness.client().create_session("cli")).session_id
    for pid in process_ids:
        await procs.start(sid, pid, f"python3 app.py --name {pid}")
    return sid


async def test_ps_lists_state_pid_output_and_command(
    procs: ProcHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = await _session(procs, "p_1", "p_2", "p_3")
    table = procs.table(sid)
    await table.emit("p_1", "stdout", b"x" * 1234)
    await table.finish("p_2", 3)
    await table.finish("p_3", None, signal=15)
    assert await run(procs, "ps", sid) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert (
        lines[0].startswith("p_1  running ")
        and "1,234 B" in lines[0]
        and "python3 app.py --name p_1" in lines[0]
    )
    assert lines[1].startswith("p_2  exited 3 ") and "pid 1001" in lines[1]
    assert lines[2].startswith("p_3  killed SIGTERM")
    assert await run(procs, "ps", sid, "--json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["process_id"], r["state"], r["exit_code"], r["signal_name"]) for r in rows] == [
        ("p_1", "running", None, None),
        ("p_2", "exited", 3, None),
        ("p_3", "killed", None, "SIGTERM"),
    ]
    assert rows[0]["output_end"] == 1234 and rows[0]["tool_use_id"] == "tu_p_1"
    empty = await _session(procs)
    assert await run(procs, "ps", empty) == 0
    out = capsys.readouterr()
    assert out.out == "" and "no processes" in out.err


async def test_logs_writes_stdout_and_stderr_apart_from_a_cursor(
    procs: ProcHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = await _session(procs, "p_1", "p_2")
    table = procs.table(sid)
    await table.emit("p_1", "stdout", b"hello\n")
    await table.emit("p_1", "stderr", b"oops\n")
    assert await run(procs, "logs", sid, "p_1") == 0
    out = capsys.readouterr()
    assert out.out == "hello\n"
    assert out.err == "oops\n[next: --after 11]\n"
    assert await run(procs, "logs", sid, "p_1", "--after", "6") == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("oops\n")
    assert await run(procs, "logs", sid, "p_1", "--after", "11") == 0
    assert "no output after cursor 11" in capsys.readouterr().err
    # The ring dropped the oldest bytes; the process ended: both are said on stderr.
    await table.emit("p_2", "stdout", b"a" * (RING_BYTES + 100))
    await table.finish("p_2", 3)
    assert await run(procs, "logs", sid, "p_2") == 0
    out = capsys.readouterr()
    assert out.out == "a" * RING_BYTES
    assert "[100 bytes lost: the output ring dropped them; going on from cursor 100]" in out.err
    assert f"[p_2 exited 3; output ends at cursor {RING_BYTES + 100}]" in out.err
    assert await run(procs, "logs", sid, "p_2", "--json") == 0
    kinds = [json.loads(line)["kind"] for line in capsys.readouterr().out.splitlines()]
    assert kinds == ["truncated", "output", "exited"]
    assert await run(procs, "logs", sid, "p_nope") == 5
    assert "NOT_FOUND" in capsys.readouterr().err


async def test_logs_follow_prints_output_as_it_comes_until_the_end(
    procs: ProcHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = await _session(procs, "p_1")
    table = procs.table(sid)
    following = asyncio.create_task(run(procs, "logs", sid, "p_1", "-f"))
    await until(lambda: table.watching == 1, "logs -f to watch")
    await table.emit("p_1", "stdout", b"line 1\n")
    await table.emit("p_1", "stderr", b"warn\n")
    await table.finish("p_1", 0)
    assert await asyncio.wait_for(following, 10) == 0
    out = capsys.readouterr()
    assert out.out == "line 1\n" and out.err == "warn\n[p_1 exited 0; output ends at cursor 12]\n"


async def test_kill_sends_term_with_a_grace_or_the_signal_named(
    procs: ProcHarness, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = await _session(procs, "p_1")
    assert await run(procs, "kill", sid, "p_1", "--signal", "usr1") == 0
    assert capsys.readouterr().out == "p_1 running (sent SIGUSR1)\n"
    assert await run(procs, "kill", sid, "p_1") == 0
    assert capsys.readouterr().out == "p_1 killed SIGTERM (sent SIGTERM)\n"
    assert procs.table(sid).signals_of("p_1") == ["USR1", "TERM"]
    with pytest.raises(SystemExit) as exit_:
        await run(procs, "kill", sid, "p_1", "--signal", "STOP")
    assert exit_.value.code == 2 and "expected one of TERM" in capsys.readouterr().err
    assert await run(procs, "kill", sid, "p_nope") == 5


async def test_the_blocking_client_lists_watches_writes_and_signals(procs: ProcHarness) -> None:
    sid = await _session(procs, "p_1")
    table = procs.table(sid)
    await table.emit("p_1", "stdout", b"ready\n")

    def use() -> tuple[list[ProcessInfo], list[object], ProcessInfo, ProcessInfo]:
        with DispatcherClient(procs.harness.target, token=TOKEN_ALPHA) as client:
            listed = client.list_processes(sid)
            wrote = client.write_process_input(sid, "p_1", b"quit\n", close_stdin=True)
            stopped = client.signal_process(sid, "p_1", "TERM", grace_seconds=1)
            items: list[object] = list(client.watch_process(sid, "p_1"))
            with pytest.raises(RequestFailed) as err:
                client.list_processes("s_unknown")
            assert err.value.code == "NOT_FOUND"
            return listed, items, wrote, stopped

    listed, items, wrote, stopped = await asyncio.to_thread(use)
    assert [p.process_id for p in listed] == ["p_1"] and not wrote.stdin_open
    assert table.stdin_of("p_1") == b"quit\n" and stopped.state == "killed"
    assert items[0] == OutputChunk("stdout", 0, b"ready\n")
    assert isinstance(items[-1], ProcessInfo) and items[-1].signal == 15
    assert not any(isinstance(i, ProcessTruncated) for i in items)
