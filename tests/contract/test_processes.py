"""``Sandbox.processes()``: a session's background processes, as ``core.process_api`` states them,
held to one behaviour on every sandbox that has a table: start (retry-safe), list, read by cursor
with stdout and stderr apart, watch live to the end, input and its close, a stop that leaves
nothing of the group, wait; and exec's leftovers and shell state."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import pytest

from dispatcher.core.process_api import OutputChunk, ProcessControl, ProcessError, ProcessInfo, ProcessStart
from tests.contract.helpers import run, sh
from tests.contract.targets import Capability, Target
from tests.polling import until


@pytest.fixture
def table(target: Target) -> ProcessControl:
    target.require(Capability.PROCESSES)
    return target.sandbox.processes()


async def _read_to_end(table: ProcessControl, process_id: str, after: int = 0) -> tuple[bytes, bytes, int]:
    """Stdout and stderr from ``after`` until the process ended and all was read; the end cursor."""
    out, err = bytearray(), bytearray()
    for _ in range(200):
        got = await table.read(process_id, after=after, wait_seconds=5)
        assert got.lost == 0
        for chunk in got.chunks:
            assert chunk.cursor == after
            (out if chunk.stream == "stdout" else err).extend(chunk.data)
            after += len(chunk.data)
        assert got.next == after
        if not got.chunks and got.state != "running":
            return bytes(out), bytes(err), after
    raise AssertionError(f"{process_id} did not end")


async def _read_until(table: ProcessControl, process_id: str, want: bytes) -> int:
    """Read stdout until ``want`` appeared; the cursor after it."""
    after, seen = 0, b""
    for _ in range(100):
        got = await table.read(process_id, after=after, wait_seconds=5)
        seen += b"".join(c.data for c in got.chunks if c.stream == "stdout")
        after = got.next
        if want in seen:
            return after
    raise AssertionError(f"{want!r} never came: {seen!r}")


async def test_a_session_without_processes_lists_none_and_knows_no_id(table: ProcessControl) -> None:
    assert await table.list() == ()
    for op in (table.read("p_nope"), table.write_input("p_nope", b"x"), table.signal("p_nope", "TERM")):
        with pytest.raises(ProcessError) as caught:
            await op
        assert caught.value.code == "no_process" and "process_list" in str(caught.value)


async def test_output_by_cursor_keeps_stdout_and_stderr_apart(table: ProcessControl) -> None:
    command = "echo out1; echo err1 >&2; sleep 0.1; echo out2; exit 3"
    started = await table.start(ProcessStart("p_out", command, tool_use_id="toolu_a"))
    assert (started.process_id, started.command, started.tool_use_id) == ("p_out", command, "toolu_a")
    assert started.origin == "background" and started.cwd == "."
    out, err, end = await _read_to_end(table, "p_out")
    assert (out, err, end) == (b"out1\nout2\n", b"err1\n", 15)
    # From a cursor in the middle: only what comes after it.
    tail = await table.read("p_out", after=end - 5)
    assert b"".join(c.data for c in tail.chunks) == b"out2\n" and tail.next == end
    # Past the end: nothing, at once, with the exit.
    past = await table.read("p_out", after=end, wait_seconds=5)
    assert (past.chunks, past.next, past.state, past.exit_code) == ((), end, "exited", 3)
    [record] = [p for p in await table.list() if p.process_id == "p_out"]
    assert (record.state, record.exit_code, record.end, record.first) == ("exited", 3, 15, 0)
    assert record.ended is not None and record.ended >= record.started


async def test_a_start_is_retry_safe_and_an_id_names_one_command(table: ProcessControl) -> None:
    first = await table.start(ProcessStart("p_same", "sleep 30"))
    again = await table.start(ProcessStart("p_same", "sleep 30"))
    assert again.pid == first.pid and [p.process_id for p in await table.list()].count("p_same") == 1
    with pytest.raises(ProcessError) as caught:
        await table.start(ProcessStart("p_same", "sleep 31"))
    assert caught.value.code == "conflict"
    await table.signal("p_same", "KILL", grace_seconds=1)


async def test_a_watch_follows_live_from_a_cursor_and_ends_with_the_record(table: ProcessControl) -> None:
    await table.start(ProcessStart("p_talk", 'echo hello; read line; echo "got $line"; exit 4'))
    cursor = await _read_until(table, "p_talk", b"hello\n")
    assert cursor == 6
    seen: list[OutputChunk | ProcessInfo] = []
    stream = table.watch("p_talk", after=3)  # from inside the first line
    first = await anext(stream)
    assert first == OutputChunk("stdout", 3, b"lo\n")
    await table.write_input("p_talk", b"there\n")  # what it prints next comes live
    async for item in stream:
        seen.append(item)
    *chunks, end = seen
    assert b"".join(c.data for c in chunks if isinstance(c, OutputChunk)) == b"got there\n"
    assert isinstance(end, ProcessInfo) and (end.state, end.exit_code, end.end) == ("exited", 4, 16)


async def test_a_watch_closed_early_leaves_the_process_and_the_sandbox_as_they_were(
    table: ProcessControl, target: Target
) -> None:
    await table.start(ProcessStart("p_tick", "while :; do echo tick; sleep 0.02; done"))
    stream = table.watch("p_tick")
    got = [await anext(stream), await anext(stream)]
    assert all(isinstance(c, OutputChunk) for c in got)
    await _close(stream)
    [record] = [p for p in await table.list() if p.process_id == "p_tick"]
    assert record.running
    assert await sh(target, "echo still") == b"still\n"
    again = table.watch("p_tick", after=record.end)  # and another watch works
    chunk = await anext(again)
    assert isinstance(chunk, OutputChunk) and chunk.cursor >= record.end
    await _close(again)
    await table.signal("p_tick", "KILL", grace_seconds=1)


async def test_input_and_its_close_reach_the_process(table: ProcessControl) -> None:
    info = await table.start(ProcessStart("p_cat", "cat; echo done"))
    assert info.stdin_open
    await table.write_input("p_cat", b"line one\n")
    closed = await table.write_input("p_cat", b"line two\n", close=True)
    out, _, _ = await _read_to_end(table, "p_cat")
    assert out == b"line one\nline two\ndone\n" and not closed.stdin_open
    with pytest.raises(ProcessError) as caught:
        await table.write_input("p_cat", b"more")
    assert caught.value.code == "not_running"


async def test_a_stop_kills_a_group_that_ignores_term_after_the_grace(
    table: ProcessControl, target: Target
) -> None:
    target.require(Capability.COMMANDS)
    command = "trap '' TERM; sh -c 'trap \"\" TERM; echo child; sleep 60' & sleep 60"
    info = await table.start(ProcessStart("p_stubborn", command))
    await _read_until(table, "p_stubborn", b"child\n")

    async def all_four() -> bool:  # two shells, each in a sleep (the last fork may still come)
        return await sh(target, _live_in_group(info.pid)) == b"4\n"

    await until(all_four, "the group's four processes")
    stopped = await table.signal("p_stubborn", "TERM", grace_seconds=0.5)
    assert (stopped.state, stopped.signal) == ("killed", 9)
    assert await sh(target, _live_in_group(info.pid)) == b"0\n"


async def _close(stream: AsyncIterator[object]) -> None:
    """Close a watch early (``ProcessControl.watch`` is typed as an iterator; it is a generator)."""
    await cast(AsyncGenerator[object, None], stream).aclose()


def _live_in_group(pgid: int) -> str:
    """A command printing how many processes of group ``pgid`` live (zombies, which only wait for
    their parent to reap them, are not counted; ``ps``, no awk in the image)."""
    return (
        f'n=0; for s in $(ps -eo pgid=,stat= | while read g s; do [ "$g" = {pgid} ] && echo $s; done);'
        " do case $s in Z*) ;; *) n=$((n+1));; esac; done; echo $n"
    )


async def test_wait_answers_the_record_once_the_process_ended(table: ProcessControl) -> None:
    await table.start(ProcessStart("p_wait", "sleep 0.3; exit 7"))
    ended = await asyncio.wait_for(table.wait("p_wait"), 30)
    assert (ended.state, ended.exit_code) == ("exited", 7)
    assert (await table.wait("p_wait")).exit_code == 7  # an ended one answers at once
    with pytest.raises(ProcessError) as caught:
        await table.wait("p_never")
    assert caught.value.code == "no_process"


async def test_a_cancelled_wait_leaves_the_process_running(table: ProcessControl) -> None:
    await table.start(ProcessStart("p_long", "sleep 60"))
    waiting = asyncio.ensure_future(table.wait("p_long"))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(waiting), 0.3)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    [record] = [p for p in await table.list() if p.process_id == "p_long"]
    assert record.running
    await table.signal("p_long", "KILL", grace_seconds=1)


async def test_what_a_command_leaves_running_becomes_a_process(table: ProcessControl, target: Target) -> None:
    target.require(Capability.COMMANDS)
    ran = await run(target, "(sleep 0.5; echo late) & echo now", leave_as="p_left")
    assert (ran.result.exit_code, ran.stdout, ran.result.left) == (0, b"now\n", ("p_left",))
    [record] = [p for p in await table.list() if p.process_id == "p_left"]
    assert record.origin == "left"
    out, _, _ = await _read_to_end(table, "p_left")
    assert out == b"late\n"


async def test_a_command_reports_where_its_shell_ended(target: Target) -> None:
    target.require(Capability.COMMANDS)
    target.require(Capability.PROCESSES)
    ran = await run(
        target, "mkdir -p sub/dir && cd sub/dir && export FOO='a b' && unset HOME", capture_state=True
    )
    state = ran.result.shell_state
    assert state is not None and ran.stdout == b""
    assert (state.cwd, state.env.get("FOO"), "HOME" in state.unset) == ("sub/dir", "a b", True)
    unknown = await run(target, "exec true", capture_state=True)
    assert unknown.result.shell_state is None  # it replaced its shell: nothing known
    plain = await run(target, "cd sub")
    assert plain.result.shell_state is None  # not asked
