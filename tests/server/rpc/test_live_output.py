"""Issue 22 item 3 through gRPC: live output flows for the whole run; a reader that falls behind
gets a gap marker instead of slowing the call or growing the server's memory."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert
from tests.events import ToolOutputDelta, events_of
from tests.server.conftest import Harness, ServerFactory
from tests.server.helpers import text_of

SIZE = int(os.environ.get("LIVE_OUTPUT_MIB", "20")) << 20
GAP = re.compile(r"\[\.\.\. ([\d,]+) bytes of output skipped")


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _delta_bytes(events: list[Event]) -> tuple[int, int]:
    """Bytes of output the deltas carried, and bytes gap markers said were skipped."""
    carried = skipped = 0
    for event in events_of(events, ToolOutputDelta):
        gap = GAP.search(event.payload.text)
        if gap:
            skipped += int(gap.group(1).replace(",", ""))
        else:
            carried += len(event.payload.text.encode())
    return carried, skipped


async def test_a_fast_reader_gets_every_byte_and_a_stalled_watcher_a_gap(make_server: ServerFactory) -> None:
    server: Harness = await make_server(tool_confirmation={"default": {"EXECUTE": "auto"}})
    client = server.client()
    info = await client.create_session("live")
    await client.call(info.session_id, "echo", {"text": "first"})
    # A watcher that reads one event (so it is surely subscribed), then nothing until the end.
    watch = client._stub.WatchSession(
        pb.WatchSessionRequest(session_id=info.session_id, after_seq=0), metadata=client._metadata
    )
    await watch.read()
    before = _rss()

    # A long build's pace (64 KiB at a time, a few ms apart), not a pipe's: a reader that keeps up
    # with that must get every byte. The stalled watcher falls behind all the same.
    chunk = 64 << 10
    command = f"for i in $(seq {SIZE // chunk}); do head -c {chunk} /dev/zero | tr '\\0' a; done"
    carried = skipped = 0
    result: ToolResultBlock | None = None
    async for item in client.dispatch(info.session_id, [ToolUseBlock("big", "shell", {"command": command})]):
        if isinstance(item, ToolResultBlock):
            result = item
        else:
            counted = _delta_bytes([item])  # counted as they come: the test holds no output itself
            carried, skipped = carried + counted[0], skipped + counted[1]
    grown = _rss() - before

    assert result is not None and not result.is_error
    assert "bytes of output omitted" in text_of(result) and len(text_of(result)) < 200_000  # head+tail
    assert (carried, skipped) == (SIZE, 0)  # every byte, live, no gap for a reader that keeps up
    assert grown < 64 << 20, f"server and client grew by {grown >> 20} MiB for {SIZE >> 20} MiB of output"

    watched: list[Event] = []
    while True:
        message = await asyncio.wait_for(watch.read(), 30)
        event = convert.event_from_pb(message.event)
        assert event is not None
        watched.append(event)
        if event.type == "tool.completed" and event.tool_use_id == "big":
            break
    watch.cancel()
    carried, skipped = _delta_bytes(watched)
    assert skipped > 0 and carried + skipped == SIZE  # what it missed is said, to the byte
    seqs = [e.seq for e in watched]
    assert seqs == sorted(set(seqs))  # the marker takes a skipped seq: still strictly increasing
