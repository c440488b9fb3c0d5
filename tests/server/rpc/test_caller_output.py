"""The caller of a Dispatch gets every byte of its own output (issue 37 item 1), through a real
server and agent (the local backend; ``tests/integration/grpc/test_caller_output_docker.py`` is
the same in a container): its output waits for a slow caller, and a command stopped while it waits
ends within its kill sequence, its sandbox kept."""

from __future__ import annotations

import asyncio

from dispatcher.core.events.payloads import TOOL_FAILED, ToolFailed
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.blocks import text_at
from tests.server.caller_output import EXPECTED, SKIPPED, read_slowly, small_window_client, watched_until
from tests.server.conftest import Harness


async def test_a_slow_caller_gets_every_byte(harness: Harness) -> None:
    caller = small_window_client(harness)
    session = await caller.create_session("slow-caller")
    received, result = await read_slowly(caller, session.session_id, "tu_big")
    assert not result.is_error, result
    assert SKIPPED.search(received) is None and received == EXPECTED


async def test_a_command_waiting_for_its_caller_times_out_in_time_and_keeps_its_sandbox(
    harness: Harness,
) -> None:
    caller = small_window_client(harness)
    session = await caller.create_session("paced-timeout")
    sid = session.session_id
    watcher = harness.client().watch(sid)
    first = asyncio.ensure_future(watched_until(watcher, "tu_hi"))
    assert not (await caller.call(sid, "shell", {"command": "echo hi"}, tool_use_id="tu_hi")).is_error
    await first
    stream = caller.dispatch(sid, [ToolUseBlock("tu_yes", "shell", {"command": "yes", "timeout_seconds": 2})])
    while getattr(await anext(stream), "type", "") != "tool.output_delta":
        pass  # the output has started; the caller now stops reading, and the command waits
    # It times out while it waits: its end is read all the same (a watcher, reading, sees it).
    ended = (await watched_until(watcher, "tu_yes", (TOOL_FAILED,)))[-1]
    assert isinstance(ended.payload, ToolFailed) and ended.payload.error_class == "timeout"
    items = [item async for item in stream]  # the caller reads again
    (result,) = [i for i in items if isinstance(i, ToolResultBlock)]
    assert result.error_class is not None and result.error_class.value == "timeout"
    # Its end was read within the kill sequence (SIGTERM): the command's own timeout answered,
    # not the dispatcher giving the call up, nor the agent given up as unresponsive.
    assert (result.metadata.get("timed_out"), result.metadata.get("signal")) == (True, 15), result.metadata
    assert "sandbox_error" not in result.metadata
    assert "[sandbox:" not in text_at(result) and "sandbox failed" not in text_at(result)
    again = await caller.call(sid, "shell", {"command": "echo still here"})
    assert not again.is_error and "still here" in text_at(again)
    assert "[sandbox:" not in text_at(again)
