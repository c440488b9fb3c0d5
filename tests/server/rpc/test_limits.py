"""Issue 22 item 3 through gRPC: the request limit, the per-call input limit and write_file's
documented size agree; the result's character budget is the result's, not each block's."""

from __future__ import annotations

import base64
import json

import pytest

from dispatcher.client import RequestFailed
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.server.conftest import Harness, ServerFactory
from tests.server.helpers import text_of

MAX_WRITE = 4_128_768  # what write_file's description promises (dispatcher.max_write_bytes)


@pytest.fixture
async def server(make_server: ServerFactory) -> Harness:
    return await make_server(
        tool_confirmation={"default": {"WRITE": "auto", "EXECUTE": "auto"}},
        # the block tool too: the tiny tenant of the base config lists it (an unknown name is an error)
        tools=[
            "tests.server.tools:make_echo_tool",
            "tests.server.tools:make_block_tool",
            "tests.server.limit_tools:make_blocks_tool",
        ],
    )


async def _results(server: Harness, uses: list[ToolUseBlock]) -> dict[str, ToolResultBlock]:
    client = server.client()
    info = await client.create_session("limits")
    items = [i async for i in client.dispatch(info.session_id, uses)]
    return {i.tool_use_id: i for i in items if isinstance(i, ToolResultBlock)}


def _write(tid: str, size: int) -> ToolUseBlock:
    content = base64.b64encode(b"\x00" * size).decode()
    return ToolUseBlock(tid, "write_file", {"path": f"{tid}.bin", "content": content, "encoding": "base64"})


async def test_the_largest_documented_write_goes_through_with_its_siblings(server: Harness) -> None:
    results = await _results(
        server, [_write("big", MAX_WRITE), ToolUseBlock("sib", "echo", {"text": "here"})]
    )
    assert not results["big"].is_error, text_of(results["big"])
    assert text_of(results["sib"]) == "here"
    (workspace,) = (server.tmp / "ws-alpha").glob("limits")
    assert (workspace / "big.bin").stat().st_size == MAX_WRITE


async def test_a_write_over_its_limit_is_that_calls_validation_error(server: Harness) -> None:
    results = await _results(
        server, [_write("big", MAX_WRITE + 1), ToolUseBlock("sib", "echo", {"text": "here"})]
    )
    big = results["big"]
    assert (big.error_class, big.reason) == ("validation_error", "invalid_args")
    assert f"{MAX_WRITE:,}" in text_of(big) and "max_write_bytes" in text_of(big)
    assert text_of(results["sib"]) == "here"


async def test_an_input_over_the_input_limit_is_that_calls_error(server: Harness) -> None:
    huge = ToolUseBlock("huge", "echo", json.dumps({"text": "x" * (6 << 20)}))
    results = await _results(server, [huge, ToolUseBlock("sib", "echo", {"text": "here"})])
    assert (results["huge"].error_class, results["huge"].reason) == ("validation_error", "input_too_large")
    assert "dispatcher.max_input_bytes" in text_of(results["huge"])
    assert text_of(results["sib"]) == "here"


async def test_only_a_request_over_the_request_limit_fails_whole(server: Harness) -> None:
    half = "x" * (4 << 20)  # two inputs under the input limit, together over the 8 MiB request
    uses = [ToolUseBlock("a", "echo", {"text": half}), ToolUseBlock("b", "echo", {"text": half})]
    with pytest.raises(RequestFailed) as failed:
        await _results(server, uses)
    assert failed.value.code == "RESOURCE_EXHAUSTED"


async def test_the_character_budget_is_per_result(server: Harness) -> None:
    results = await _results(server, [ToolUseBlock("five", "blocks", {"count": 5, "chars": 48_000})])
    texts = [getattr(b, "text", "") for b in results["five"].content]
    assert len(texts) == 5 and all("characters truncated" in t for t in texts)
    assert sum(len(t) for t in texts) <= 48_000
