"""The worker's stdout told apart: a cell's output and the worker's frames, however it is cut."""

from __future__ import annotations

import json

import pytest

from dispatcher.tools.code import frames
from dispatcher.tools.code.frames import Frame, FrameError, FrameReader, Output

MARKER = "\x1edispatcher-abc:"


def _all(reader: FrameReader, pieces: list[bytes]) -> list[Output | Frame]:
    items: list[Output | Frame] = []
    for piece in pieces:
        items.extend(reader.feed(piece))
    return items


def test_output_and_frames_come_apart_in_order_whatever_the_cuts() -> None:
    stream = b"hello " + MARKER.encode() + b'{"type":"done","id":"a"}\n' + b"after\x1e not a marker"
    for cut in range(1, len(stream)):
        items = _all(FrameReader(MARKER), [stream[:cut], stream[cut:]])
        output = b"".join(i.data for i in items if isinstance(i, Output))
        frames_ = [i.message for i in items if isinstance(i, Frame)]
        assert frames_ == [{"type": "done", "id": "a"}], cut
        assert output == b"hello after\x1e not a marker", cut


def test_bytes_that_may_begin_the_marker_wait_for_the_next_ones() -> None:
    reader = FrameReader(MARKER)
    assert reader.feed(b"text\x1edisp") == [Output(b"text")]
    assert reader.rest() == b"\x1edisp"
    assert reader.feed(b"lay") == [Output(b"\x1edisplay")]


def test_a_frame_past_the_bound_or_not_json_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frames, "MAX_FRAME_BYTES", 100)
    with pytest.raises(FrameError, match="longer than 100 bytes"):
        FrameReader(MARKER).feed(MARKER.encode() + b"x" * 101)
    with pytest.raises(FrameError, match="not JSON"):
        FrameReader(MARKER).feed(MARKER.encode() + b"{nope\n")
    with pytest.raises(FrameError, match="not a JSON object"):
        FrameReader(MARKER).feed(MARKER.encode() + json.dumps([1]).encode() + b"\n")
