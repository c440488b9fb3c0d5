"""The caller of a Dispatch gets every byte of its own output (issue 37 item 1), on a real gRPC
server and a real container: a client that reads slowly slows the command down instead of losing
the middle of its output, while a watcher of the same session that does not keep up still skips,
with the marker saying how much."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.core.events.payloads import ToolOutputDelta
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.server.caller_output import EXPECTED, SKIPPED, read_slowly, small_window_client, watched_until
from tests.server.conftest import Harness

pytestmark = pytest.mark.docker


async def test_a_slow_caller_gets_every_byte_of_3_mb_and_a_slow_watcher_skips(
    docker_harness: Harness,
) -> None:
    caller = small_window_client(docker_harness)
    session = await caller.create_session("caller-output")
    sid = session.session_id
    watcher = small_window_client(docker_harness).watch(sid)
    # The watcher is live before the big call: it reads the first call's events, then stops.
    first = asyncio.ensure_future(watched_until(watcher, "tu_hello"))
    hello = [
        i async for i in caller.dispatch(sid, [ToolUseBlock("tu_hello", "shell", {"command": "echo hi"})])
    ]
    assert isinstance(hello[-1], ToolResultBlock) and not hello[-1].is_error
    await first

    received, result = await read_slowly(caller, sid, "tu_big")

    assert not result.is_error, result
    assert SKIPPED.search(received) is None  # no gap marker: nothing was skipped for the caller
    assert len(received) == len(EXPECTED)
    assert received == EXPECTED  # every byte, in order
    # The watcher did not keep up: it missed output, and was told how much.
    seen = await watched_until(watcher, "tu_big")
    deltas = [
        e.payload.text for e in seen if isinstance(e.payload, ToolOutputDelta) and e.tool_use_id == "tu_big"
    ]
    markers = [int(m.group(1).replace(",", "")) for m in map(SKIPPED.search, deltas) if m is not None]
    assert markers, "the watcher was not told it missed output"
    shown = sum(len(d) for d in deltas if SKIPPED.search(d) is None)
    assert shown + sum(markers) == len(EXPECTED)  # what it saw plus what the markers count: all
