"""The process table through a real agent: start, read by cursor, wait, watch, stdin, signals to
the whole group, leftovers of foreground commands, and every bound with its error."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.sandbox.agent import protocol as p
from dispatcher.sandbox.agent.process import group_alive as _group_alive
from dispatcher.sandbox.agent.table import Limits
from tests.polling import until_sync

from .served_agent import DEADLINE, Link, Served

LIMITS = Limits(
    running=3, ring_bytes=4096, max_ring_bytes=8192, total_ring_bytes=40_000, finished=2, stdin_bytes=1000
)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    root = tmp_path / "ws"
    root.mkdir()
    agent = Served(str(root), limits=LIMITS)
    yield agent
    agent.close()


@pytest.fixture
def link(served: Served) -> Link:
    return served.link


def _ended(link: Link, process_id: str) -> p.ProcOutput:
    """Read until the process ended (waiting, never spinning)."""
    deadline = time.monotonic() + DEADLINE
    after = 0
    while True:
        out = link.call(p.ProcRead(process_id, after, wait_seconds=DEADLINE, max_bytes=p.MAX_READ))
        assert isinstance(out, p.ProcOutput), out
        after = out.next
        if out.state != "running" and not out.chunks:
            return out
        assert time.monotonic() < deadline


def _text(out: p.ProcOutput, stream: str) -> bytes:
    return b"".join(c.data for c in out.chunks if c.stream == stream)


def test_a_background_process_keeps_its_streams_apart_on_one_cursor(link: Link) -> None:
    info = link.call(p.ProcStart("p_1", "echo out; echo err >&2; exit 3", tool_use_id="toolu_9"))
    assert isinstance(info, p.ProcInfo)
    assert (info.tool_use_id, info.origin, info.ring_bytes) == ("toolu_9", "background", 4096)
    assert info.pid > 0
    end = _ended(link, "p_1")
    assert (end.state, end.exit_code, end.signal) == ("exited", 3, None)
    out = link.call(p.ProcRead("p_1"))
    assert (_text(out, "stdout"), _text(out, "stderr"), out.next, out.lost) == (b"out\n", b"err\n", 8, 0)
    [record] = link.call(p.ProcListRequest()).processes
    assert (record.process_id, record.exit_code, record.end) == ("p_1", 3, 8)
    assert record.ended is not None and record.ended >= record.started


def test_the_same_id_and_command_start_one_process_another_command_is_a_conflict(link: Link) -> None:
    first = link.call(p.ProcStart("p_1", "sleep 30"))
    again = link.call(p.ProcStart("p_1", "sleep 30"))
    assert again.pid == first.pid
    refused = link.call(p.ProcStart("p_1", "sleep 31"))
    assert isinstance(refused, p.Error) and refused.code == "conflict"
    assert len(link.call(p.ProcListRequest()).processes) == 1


def test_a_read_waits_for_output_without_a_busy_loop(link: Link) -> None:
    link.call(p.ProcStart("p_1", "sleep 0.3; echo late; sleep 30"))
    started = time.monotonic()
    out = link.call(p.ProcRead("p_1", wait_seconds=DEADLINE))
    assert _text(out, "stdout") == b"late\n" and out.state == "running"
    assert 0.2 < time.monotonic() - started < DEADLINE / 2
    quiet = link.call(p.ProcRead("p_1", out.next, wait_seconds=0.2))
    assert quiet.chunks == () and quiet.next == out.next


def test_nobody_reading_slows_nothing_and_a_late_reader_learns_what_it_lost(link: Link) -> None:
    link.call(p.ProcStart("p_1", "head -c 300000 /dev/zero; echo tail"))
    end = _ended(link, "p_1")
    assert end.exit_code == 0
    out = link.call(p.ProcRead("p_1", 0, max_bytes=p.MAX_READ))
    held = sum(len(c.data) for c in out.chunks)
    assert out.lost > 0 and out.lost + held == 300_005 == out.next
    assert out.chunks[0].cursor == out.lost and out.chunks[-1].data.endswith(b"tail\n")


def test_stdin_is_fed_and_closed(link: Link) -> None:
    link.call(p.ProcStart("p_1", "cat; echo done"))
    info = link.call(p.ProcInput("p_1", b"hello\n"))
    assert info.stdin_open
    info = link.call(p.ProcInput("p_1", b"bye\n", close=True))
    assert not info.stdin_open
    end = _ended(link, "p_1")
    assert end.exit_code == 0
    assert _text(link.call(p.ProcRead("p_1")), "stdout") == b"hello\nbye\ndone\n"
    refused = link.call(p.ProcInput("p_1", b"more"))
    assert isinstance(refused, p.Error) and refused.code == "not_running"


def test_a_flood_of_stdin_nobody_reads_is_refused(link: Link) -> None:
    link.call(p.ProcStart("p_1", "sleep 30"))
    # The pipe takes what its buffer holds; the rest waits in the agent, up to its bound.
    for _ in range(200):
        answer = link.call(p.ProcInput("p_1", b"x" * 900))
        if isinstance(answer, p.Error):
            break
    assert isinstance(answer, p.Error) and answer.code == "too_large" and "1000" in answer.message


def test_stop_reaches_the_whole_group_and_kills_what_ignores_term(link: Link) -> None:
    info = link.call(p.ProcStart("p_1", "trap '' TERM; sleep 30 & sleep 30 & echo up; wait"))
    assert _text(link.call(p.ProcRead("p_1", wait_seconds=DEADLINE)), "stdout") == b"up\n"
    started = time.monotonic()
    stopped = link.call(p.ProcSignal("p_1", "TERM", grace_seconds=0.3))
    assert stopped.state == "killed" and stopped.signal == 9
    assert time.monotonic() - started < DEADLINE / 2
    assert not _group_alive(info.pid)


def test_exited_means_the_group_is_empty_not_only_the_leader_gone(link: Link) -> None:
    info = link.call(p.ProcStart("p_1", "sleep 0.5 >/dev/null 2>&1 & exit 3"))
    early = link.call(p.ProcRead("p_1", wait_seconds=0.2))
    assert early.state == "running"  # the leader exited; its child still runs in the group
    end = _ended(link, "p_1")
    assert (end.state, end.exit_code) == ("exited", 3)
    assert not _group_alive(info.pid)


def test_a_watch_streams_output_then_the_record(link: Link) -> None:
    link.call(p.ProcStart("p_1", "for i in 1 2 3; do echo $i; sleep 0.05; done"))
    rid = link.send(p.ProcWatch("p_1"))
    frames = link.frames(rid)
    data = [p.ProcData.decode(h, b) for h, b in frames[:-1]]
    assert b"".join(d.data for d in data) == b"1\n2\n3\n"
    assert [d.cursor for d in data] == [sum(len(x.data) for x in data[:i]) for i in range(len(data))]
    end = p.ProcWatch("p_1").decode_reply(*frames[-1])
    assert (end.state, end.exit_code, end.end) == ("exited", 0, 6)


def test_an_unwatched_watch_ends_with_the_running_record(link: Link) -> None:
    link.call(p.ProcStart("p_1", "sleep 30"))
    rid = link.send(p.ProcWatch("p_1"))
    stop = link.send(p.ProcUnwatch(rid))
    frames = {}
    for _ in range(2):
        header, payload = link.recv()
        frames[header["id"]] = (header, payload)
    assert p.ProcWatch("p_1").decode_reply(*frames[rid]).state == "running"
    assert frames[stop][0]["type"] == "result"


def test_every_bound_has_its_error(link: Link) -> None:
    for i in range(3):
        assert isinstance(link.call(p.ProcStart(f"p_{i}", "sleep 30")), p.ProcInfo)
    fourth = link.call(p.ProcStart("p_3", "sleep 30"))
    assert isinstance(fourth, p.Error) and fourth.code == "too_many" and "3 processes" in fourth.message
    for i in range(3):
        link.call(p.ProcSignal(f"p_{i}", "KILL", grace_seconds=1))
    big = link.call(p.ProcStart("p_big", "true", ring_bytes=9000))
    assert isinstance(big, p.Error) and big.code == "too_large"
    # Finished processes beyond the bound are forgotten, oldest first.
    assert [r.process_id for r in link.call(p.ProcListRequest()).processes] == ["p_1", "p_2"]
    gone = link.call(p.ProcRead("p_0"))
    assert isinstance(gone, p.Error) and gone.code == "no_process"


def test_all_rings_together_are_bounded_finished_ones_giving_way_first(tmp_path: Path) -> None:
    served = Served(str(tmp_path), limits=Limits(total_ring_bytes=20_000, max_ring_bytes=8192))
    try:
        link = served.link
        for i in range(2):
            assert isinstance(link.call(p.ProcStart(f"p_{i}", "sleep 30", ring_bytes=8192)), p.ProcInfo)
        refused = link.call(p.ProcStart("p_2", "sleep 30", ring_bytes=8192))
        assert isinstance(refused, p.Error) and refused.code == "too_large" and "20000" in refused.message
        link.call(p.ProcSignal("p_0", "KILL", grace_seconds=1))
        assert isinstance(link.call(p.ProcStart("p_2", "sleep 30", ring_bytes=8192)), p.ProcInfo)
        assert [r.process_id for r in link.call(p.ProcListRequest()).processes] == ["p_1", "p_2"]
    finally:
        served.close()


def test_closing_the_channel_kills_every_process_outside_a_container(served: Served) -> None:
    info = served.link.call(p.ProcStart("p_1", "sleep 30 & sleep 30"))
    served.close()
    until_sync(lambda: not _group_alive(info.pid), "the group to die with the agent", timeout=DEADLINE)


def test_fifty_megabytes_nobody_reads_leave_the_last_mebibyte_and_an_exact_count(tmp_path: Path) -> None:
    served = Served(str(tmp_path))  # the default bounds: a 1 MiB ring
    try:
        link = served.link
        started = time.monotonic()
        link.call(p.ProcStart("p_1", "head -c 50000000 /dev/urandom"))
        end = _ended(link, "p_1")
        assert end.exit_code == 0 and time.monotonic() - started < DEADLINE
        record = link.call(p.ProcListRequest()).processes[0]
        assert record.end == 50_000_000 and record.ring_bytes == 1 << 20
        assert 50_000_000 - record.first <= 1 << 20
        out = link.call(p.ProcRead("p_1", 0, max_bytes=p.MAX_READ))
        assert out.lost == record.first and out.chunks[0].cursor == record.first
    finally:
        served.close()
