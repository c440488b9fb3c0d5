"""The output ring: one cursor over both streams, bounded, and honest about what it dropped."""

from __future__ import annotations

from dispatcher.sandbox.agent.ring import PIECE_OVERHEAD, Ring


def test_both_streams_share_one_cursor_and_keep_their_order() -> None:
    ring = Ring(1 << 20)
    ring.append("stdout", b"ab")
    ring.append("stderr", b"c")
    ring.append("stdout", b"de")
    pieces, end, lost = ring.read(0, 100)
    assert pieces == [("stdout", 0, b"ab"), ("stderr", 2, b"c"), ("stdout", 3, b"de")]
    assert (end, lost) == (5, 0)
    assert ring.read(3, 100) == ([("stdout", 3, b"de")], 5, 0)
    assert ring.read(5, 100) == ([], 5, 0)


def test_a_reader_behind_the_ring_is_told_exactly_what_it_lost() -> None:
    ring = Ring(PIECE_OVERHEAD + 100)
    for _ in range(50):
        ring.append("stdout", b"x" * 1000)
    assert ring.end == 50_000 and ring.held <= 100
    pieces, end, lost = ring.read(0, 1 << 20)
    assert lost == ring.first and lost + sum(len(d) for _, _, d in pieces) == 50_000
    assert pieces[0][1] == ring.first and end == 50_000


def test_a_read_is_bounded_and_resumes_where_it_stopped() -> None:
    ring = Ring(1 << 20)
    ring.append("stdout", b"0123456789")
    pieces, end, _ = ring.read(2, 3)
    assert pieces == [("stdout", 2, b"234")] and end == 5
    assert ring.read(end, 100)[0] == [("stdout", 5, b"56789")]


def test_alternating_streams_cannot_grow_it_past_its_capacity() -> None:
    ring = Ring(4096)
    for i in range(10_000):
        ring.append("stdout" if i % 2 else "stderr", b"z")
    pieces, end, lost = ring.read(0, 1 << 20)
    assert end == 10_000 and len(pieces) * (PIECE_OVERHEAD + 1) <= 4096
    assert lost + len(pieces) == 10_000


def test_one_write_larger_than_the_ring_keeps_its_tail() -> None:
    ring = Ring(PIECE_OVERHEAD + 10)
    ring.append("stderr", b"a" * 5 + b"0123456789")
    assert ring.read(0, 100) == ([("stderr", 5, b"0123456789")], 15, 5)


def test_a_cursor_past_the_end_reads_nothing() -> None:
    ring = Ring(1000)
    ring.append("stdout", b"abc")
    assert ring.read(99, 10) == ([], 3, 0)
