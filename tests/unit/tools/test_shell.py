"""shell through the local agent: exit codes, streaming deltas, timeout, cancel, bounded output."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dispatcher.core.errors import ToolCancelled, ToolExecutionError, ToolTimeout
from dispatcher.core.types import ToolOutput
from dispatcher.tools.shell import HEAD_BYTES, TAIL_BYTES, ShellTool
from tests.clock import jump_loop_clock
from tests.polling import until
from tests.unit.tools.conftest import Harness, text_of

DEADLINE = 5.0


def error_output(exc: pytest.ExceptionInfo[Exception]) -> ToolOutput:
    output = getattr(exc.value, "output", None)
    assert isinstance(output, ToolOutput)
    return output


async def test_success_returns_output_and_exit_code(harness: Harness, workspace: Path) -> None:
    output = await harness.run(ShellTool(), command="echo hello; pwd")
    assert text_of(output) == f"hello\n{workspace}\n"
    assert output.metadata["exit_code"] == 0 and output.success
    assert output.command_executed == "echo hello; pwd"


async def test_no_output_says_so(harness: Harness) -> None:
    assert text_of(await harness.run(ShellTool(), command="true")) == "(no output)"


async def test_nonzero_exit_is_an_execution_error_with_output(harness: Harness) -> None:
    with pytest.raises(ToolExecutionError, match="exit code 3") as info:
        await harness.run(ShellTool(), command="echo out; echo err >&2; exit 3")
    output = error_output(info)
    assert text_of(output).startswith("out\nerr\n") and "exit code 3" in text_of(output)
    assert output.metadata["exit_code"] == 3 and not output.success
    assert output.command_executed is not None


async def test_stdout_and_stderr_stay_apart_in_the_metadata(harness: Harness) -> None:
    output = await harness.run(ShellTool(), command="echo out; echo err >&2; echo more")
    assert text_of(output) in ("out\nerr\nmore\n", "out\nmore\nerr\n")  # content: interleaved
    assert output.metadata["stdout_bytes"] == 9 and output.metadata["stderr_bytes"] == 4
    assert (output.metadata["stderr_head"], output.metadata["stderr_tail"]) == ("err\n", "")
    quiet = await harness.run(ShellTool(), command="echo only")
    assert quiet.metadata["stderr_bytes"] == 0 and "stderr_head" not in quiet.metadata


async def test_a_long_stderr_keeps_its_head_and_tail(harness: Harness) -> None:
    command = "echo first >&2; head -c 100000 /dev/zero | tr '\\0' x >&2; echo; echo last >&2; exit 1"
    with pytest.raises(ToolExecutionError) as info:
        await harness.run(ShellTool(), command=command)
    metadata = error_output(info).metadata
    assert metadata["stderr_bytes"] == 6 + 100_000 + 5 and metadata["stdout_bytes"] == 1
    assert metadata["stderr_head"].startswith("first\nxxx") and len(metadata["stderr_head"]) == 1024
    assert metadata["stderr_tail"].endswith("xxxlast\n") and len(metadata["stderr_tail"]) == 1024


async def test_death_by_signal_is_reported(harness: Harness) -> None:
    with pytest.raises(ToolExecutionError, match="signal 9") as info:
        await harness.run(ShellTool(), command="kill -9 $$")
    assert error_output(info).metadata["signal"] == 9


async def test_output_streams_as_deltas_before_the_command_ends(harness: Harness, workspace: Path) -> None:
    call = asyncio.ensure_future(
        harness.run(
            ShellTool(),
            command="echo first; echo oops >&2; while [ ! -e go ]; do sleep 0.01; done; echo last",
        )
    )
    await until(lambda: "first" in harness.streamed and "oops" in harness.streamed, "the first deltas")
    assert not call.done()
    (workspace / "go").touch()
    output = await asyncio.wait_for(call, DEADLINE)
    assert text_of(output) == "first\noops\nlast\n"
    assert ("stderr", "oops\n") in harness.deltas
    assert harness.streamed.replace("oops\n", "") == "first\nlast\n"


async def run_until_ready(harness: Harness, tool: ShellTool, command: str, ready: str) -> ToolOutput:
    """Run ``command`` and let its timeout (a minute) elapse only once it printed ``ready`` (the
    loop's clock jumps): on a busy machine the timeout could come before the shell ran at all."""
    call = asyncio.ensure_future(harness.run(tool, command=command, timeout_seconds=60))
    await until(lambda: ready in harness.streamed or call.done(), f"the command to print {ready!r}")
    jump_loop_clock(60.0)
    with pytest.raises(ToolTimeout) as info:
        await call
    return error_output(info)


async def test_timeout_keeps_partial_output(harness: Harness) -> None:
    tool = ShellTool()
    tool.grace_seconds = 30.0  # bounds the wait for the exit SIGTERM causes, not a SIGKILL's
    output = await run_until_ready(harness, tool, "echo partial; sleep 30", "partial")
    assert text_of(output).startswith("partial\n") and "timed out" in text_of(output)
    assert output.metadata["timed_out"] is True and output.metadata["signal"] == 15


async def test_cancel_event_keeps_partial_output(harness: Harness) -> None:
    call = asyncio.ensure_future(harness.run(ShellTool(), command="echo partial; sleep 30"))
    await until(lambda: "partial" in harness.streamed, "the output")
    harness.cancel_event.set()
    with pytest.raises(ToolCancelled) as info:
        await asyncio.wait_for(call, DEADLINE)
    assert text_of(error_output(info)).startswith("partial\n")


async def test_tool_cancel_stops_the_command(harness: Harness) -> None:
    tool = ShellTool()
    assert await tool.cancel() is False  # not running yet
    call = asyncio.ensure_future(harness.run(tool, command="echo go; sleep 30"))
    await until(lambda: "go" in harness.streamed, "the command to start")
    assert await tool.cancel() is True
    assert await tool.cancel() is True  # idempotent while it winds down
    with pytest.raises(ToolCancelled):
        await asyncio.wait_for(call, DEADLINE)
    assert await tool.cancel() is False


async def test_sigterm_ignoring_command_is_killed_after_grace(harness: Harness) -> None:
    tool = ShellTool()
    tool.grace_seconds = 0.2
    # "stubborn" comes after the trap: SIGTERM finds it set (before it, the shell would die of it).
    output = await run_until_ready(harness, tool, "trap '' TERM; echo stubborn; sleep 30", "stubborn")
    assert output.metadata["killed"] is True and output.metadata["signal"] == 9
    assert text_of(output).startswith("stubborn\n") and "SIGKILL" in text_of(output)


async def test_large_output_is_bounded_in_result_and_streamed_whole(harness: Harness) -> None:
    size = 30_000_000
    output = await harness.run(ShellTool(), command=f"head -c {size} /dev/zero | tr '\\0' a; echo; echo END")
    text = text_of(output)
    assert text.startswith("a" * 100) and text.endswith("a\nEND\n")
    assert len(text) < HEAD_BYTES + TAIL_BYTES + 200 and "bytes of output omitted" in text
    assert output.metadata["output_bytes"] == size + 5
    streamed = sum(len(text) for _, text in harness.deltas)
    assert streamed == size + 5  # live output is never cut: only the result is
    assert max(len(text) for _, text in harness.deltas) <= 64 << 10


async def test_multibyte_characters_survive_chunking(harness: Harness) -> None:
    output = await harness.run(ShellTool(), command="for i in $(seq 1 20000); do printf 'é'; done")
    assert text_of(output) == "é" * 20000
    assert harness.streamed == "é" * 20000
