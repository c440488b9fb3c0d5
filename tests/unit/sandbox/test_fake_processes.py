"""The fake sandbox's process table holds the contract of ``core/process_api.py`` as the agent's
table does: ids and retry-safe starts, one cursor over both streams, the ring's ``lost`` count,
every bound with its error, signals, wait and watch, and close killing everything."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.core.process_api import OutputChunk, ProcessError, ProcessInfo, ProcessStart
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider
from dispatcher.sandbox.fake.processes import FakeProcesses, Limits


def start(process_id: str, command: str = "serve", **kw: object) -> ProcessStart:
    return ProcessStart(process_id=process_id, command=command, tool_use_id="tu1", **kw)  # type: ignore[arg-type]


async def test_a_start_is_retry_safe_and_another_command_under_its_id_is_a_conflict() -> None:
    table = FakeProcesses()
    first = await table.start(start("p_1"))
    again = await table.start(start("p_1"))
    assert first.state == "running" and first.origin == "background" and first.tool_use_id == "tu1"
    assert again.pid == first.pid and len(await table.list()) == 1 and len(table.starts) == 2
    with pytest.raises(ProcessError) as refused:
        await table.start(start("p_1", "other"))
    assert refused.value.code == "conflict"


async def test_both_streams_count_on_one_cursor_and_a_read_goes_on_from_its_next() -> None:
    table = FakeProcesses()
    await table.start(start("p_1"))
    await table.output("p_1", "stdout", b"out\n")
    await table.output("p_1", "stderr", b"err\n")
    out = await table.read("p_1")
    assert [(c.stream, c.cursor, c.data) for c in out.chunks] == [
        ("stdout", 0, b"out\n"),
        ("stderr", 4, b"err\n"),
    ]
    assert out.next == 8 and out.lost == 0 and out.state == "running"
    assert (await table.read("p_1", after=out.next)).chunks == ()
    assert [c.data for c in (await table.read("p_1", after=2, max_bytes=3)).chunks] == [b"t\n", b"e"]


async def test_a_reader_behind_the_ring_is_told_exactly_how_many_bytes_it_lost() -> None:
    table = FakeProcesses()
    info = await table.start(start("p_1", ring_bytes=1024))
    assert info.ring_bytes == 1024
    for _ in range(10):
        await table.output("p_1", "stdout", b"x" * 1000)
    out = await table.read("p_1", after=0, max_bytes=1 << 20)
    held = sum(len(c.data) for c in out.chunks)
    assert out.lost == 10_000 - held and out.next == 10_000 and out.chunks[0].cursor == out.lost
    (listed,) = await table.list()
    assert (listed.first, listed.end) == (out.lost, 10_000)


async def test_the_running_bound_refuses_a_start_until_one_ends() -> None:
    table = FakeProcesses(Limits(running=2))
    await table.start(start("p_1"))
    await table.start(start("p_2"))
    with pytest.raises(ProcessError) as refused:
        await table.start(start("p_3"))
    assert refused.value.code == "too_many" and "2 processes are running" in str(refused.value)
    assert table.adopt("p_4", "left behind", ".", "tu2") is None
    await table.exit("p_1", 0)
    assert (await table.start(start("p_3"))).state == "running"


async def test_ring_bounds_refuse_a_start() -> None:
    table = FakeProcesses(Limits(max_ring_bytes=4096, total_ring_bytes=8192))
    with pytest.raises(ProcessError) as too_big:
        await table.start(start("p_1", ring_bytes=8192))
    assert too_big.value.code == "too_large"
    await table.start(start("p_1", ring_bytes=4096))
    await table.start(start("p_2", ring_bytes=4096))
    with pytest.raises(ProcessError) as full:
        await table.start(start("p_3", ring_bytes=1024))
    assert full.value.code == "too_large" and "stop a process" in str(full.value)
    await table.exit("p_1", 0)  # a finished ring is forgotten to make room
    await table.start(start("p_3", ring_bytes=1024))
    assert [i.process_id for i in await table.list()] == ["p_2", "p_3"]


async def test_finished_processes_stay_readable_up_to_their_bound() -> None:
    table = FakeProcesses(Limits(finished=2))
    for n in range(3):
        await table.start(start(f"p_{n}"))
        await table.output(f"p_{n}", "stdout", b"bye")
        await table.exit(f"p_{n}", n)
    with pytest.raises(ProcessError) as gone:
        await table.read("p_0")
    assert gone.value.code == "no_process"
    out = await table.read("p_2")
    assert out.state == "exited" and out.exit_code == 2 and out.chunks[0].data == b"bye"


async def test_stdin_is_bounded_consumed_and_closed() -> None:
    table = FakeProcesses(Limits(stdin_bytes=10))
    await table.start(start("p_1"))
    await table.write_input("p_1", b"12345")
    with pytest.raises(ProcessError) as flood:
        await table.write_input("p_1", b"123456")
    assert flood.value.code == "too_large" and table.get("p_1").pending == b"12345"
    assert table.consume("p_1") == b"12345"
    info = await table.write_input("p_1", b"123456", close=True)
    assert not info.stdin_open
    with pytest.raises(ProcessError) as closed:
        await table.write_input("p_1", b"more")
    assert closed.value.code == "not_running"


async def test_signals_end_a_process_as_killed_and_a_stop_kills_what_ignores_term() -> None:
    table = FakeProcesses()
    await table.start(start("p_1"))
    await table.start(start("p_2"))
    assert (await table.signal("p_1", "USR1")).state == "running"
    killed = await table.signal("p_1", "TERM", grace_seconds=5)
    assert (killed.state, killed.signal, killed.exit_code) == ("killed", 15, None)
    table.ignore("p_2", "TERM")
    stubborn = await table.signal("p_2", "TERM", grace_seconds=0.01)
    assert (stubborn.state, stubborn.signal) == ("killed", 9)
    assert table.get("p_2").signals == ["TERM", "KILL"]
    assert (await table.signal("p_2", "TERM")).state == "killed"  # an ended one: nothing is sent
    with pytest.raises(ProcessError) as unknown:
        await table.signal("p_9", "TERM")
    assert unknown.value.code == "no_process"


async def test_a_waiting_read_wait_and_watch_see_what_comes_later() -> None:
    table = FakeProcesses()
    await table.start(start("p_1"))
    reader = asyncio.ensure_future(table.read("p_1", wait_seconds=30))
    waiter = asyncio.ensure_future(table.wait("p_1"))
    seen: list[OutputChunk | ProcessInfo] = []

    async def follow() -> None:
        async for item in table.watch("p_1"):
            seen.append(item)

    watcher = asyncio.ensure_future(follow())
    await asyncio.sleep(0)
    assert not reader.done() and not waiter.done()
    await table.output("p_1", "stdout", b"ready\n")
    assert (await reader).chunks[0].data == b"ready\n"
    await table.output("p_1", "stderr", b"bye\n")
    await table.exit("p_1", 3)
    assert (await waiter).exit_code == 3
    await watcher
    chunks = [i for i in seen if isinstance(i, OutputChunk)]
    assert b"".join(c.data for c in chunks) == b"ready\nbye\n"
    assert isinstance(seen[-1], ProcessInfo) and seen[-1].state == "exited"


async def test_a_read_waits_no_longer_than_asked_when_nothing_comes() -> None:
    table = FakeProcesses()
    await table.start(start("p_1"))
    out = await table.read("p_1", wait_seconds=0.01)
    assert out.chunks == () and out.state == "running" and out.next == 0


async def test_closing_the_session_kills_its_processes() -> None:
    provider = FakeSandboxProvider()
    sandbox = provider.sandbox_for(Session("s1", "/tmp/ws"))
    control = sandbox.processes()
    await control.start(start("p_1"))
    assert sandbox.table.adopt("p_2", "sleep 100 &", ".", "tu2") is not None
    await provider.close_session("s1")
    states = {i.process_id: (i.state, i.signal) for i in await control.list()}
    assert states == {"p_1": ("killed", 9), "p_2": ("killed", 9)}


def test_a_sandbox_without_a_table_says_unsupported() -> None:
    with pytest.raises(ProcessError) as refused:
        FakeSandbox(has_processes=False).processes()
    assert refused.value.code == "unsupported"
