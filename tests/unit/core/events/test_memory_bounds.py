"""Memory bounded in bytes: the event history per session and every result (issue 7, point 5)."""

from __future__ import annotations

from typing import Any

from dispatcher.core import DispatcherConfig, Session, ToolDispatcher
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.events.bus import TOOL_COMPLETED, TOOL_FAILED, EventBus
from dispatcher.core.events.payloads import ToolCalled, ToolOutputDelta
from dispatcher.core.text.result_size import fit_result
from dispatcher.core.types import (
    ImageBlock,
    TextBlock,
    ToolContext,
    ToolOutput,
    ToolResultBlock,
    ToolUseBlock,
)
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.blocks import text_at
from tests.unit.core.toolkit import definition

PNG = b"\x89PNG\r\n\x1a\n"

# -- the event history ----------------------------------------------------------------------------


def test_history_bytes_never_exceed_the_budget() -> None:
    budget = 64 * 1024
    bus = EventBus("s", history=10_000, history_bytes=budget)
    for i in range(400):
        bus.publish(ToolOutputDelta("stdout", "x" * (i * 37 % 3000)), turn_id="t", tool_use_id=f"u{i}")
        assert bus.history_bytes <= budget
        assert sum(e.size for e in bus._history) == bus.history_bytes
    kept = list(bus._history)
    assert kept[-1].seq == 400 and len(kept) < 400  # the newest stay, the oldest went
    assert [e.seq for e in kept] == list(range(kept[0].seq, 401))


def test_a_huge_turn_id_is_counted_and_cannot_pin_memory() -> None:
    bus = EventBus("s", history_bytes=1 << 20)
    for _ in range(40):
        bus.publish(ToolCalled("echo", "none", {}), turn_id="t" * 3_500_000, tool_use_id="u")
    assert bus.history_bytes <= 1 << 20
    assert len(bus._history) == 0  # each alone is bigger than the budget: delivered live only


def test_the_count_cap_still_holds() -> None:
    bus = EventBus("s", history=5, history_bytes=1 << 30)
    for _ in range(20):
        bus.publish(ToolCalled("echo", "none", {"a": [1, 2, {"b": "c"}]}), turn_id="t", tool_use_id="u")
    assert [e.seq for e in bus._history] == [16, 17, 18, 19, 20]
    assert bus.history_bytes == sum(e.size for e in bus._history) > 0


async def test_history_is_still_replayed_within_the_budget() -> None:
    bus = EventBus("s", history_bytes=1 << 20)
    for _ in range(3):
        bus.publish(ToolCalled("echo", "none", {"x": "y"}), turn_id="t", tool_use_id="u")
    sub = bus.subscribe(after_seq=1)
    assert [(await sub.__anext__()).seq for _ in range(2)] == [2, 3]
    sub.close()


# -- results ---------------------------------------------------------------------------------------


class _Produce:
    """Returns whatever ``make(input)`` builds."""

    def __init__(self, name: str, make: Any) -> None:
        self.definition = definition(name, input_schema={"type": "object"})
        self._make = make

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        output: ToolOutput = self._make(input)
        return output

    async def cancel(self) -> bool:
        return False


def _dispatcher(budget: int) -> ToolDispatcher:
    d = ToolDispatcher(FakeSandboxProvider(), config=DispatcherConfig(result_budget_bytes=budget))
    d.register(
        lambda: _Produce("image", lambda i: ToolOutput([ImageBlock(PNG + b"\0" * i["n"], "image/png")]))
    )
    d.register(lambda: _Produce("texts", lambda i: ToolOutput([TextBlock("é" * 40_000)] * i["n"])))
    d.register(
        lambda: _Produce("odd", lambda i: ToolOutput([TextBlock("caf\udce9")], command_executed="\ud800"))
    )
    return d


async def test_an_image_too_big_for_one_result_is_an_error_result_for_that_call(tmp_path: Any) -> None:
    d = _dispatcher(100_000)
    session = Session("s1", str(tmp_path), "t1")
    results = await d.dispatch_all(
        [
            ToolUseBlock("big", "image", {"n": 200_000}),
            ToolUseBlock("small", "image", {"n": 1_000}),
            ToolUseBlock("text", "texts", {"n": 1}),
        ],
        session,
    )
    big, small, text = results
    assert big.is_error and big.error_class is ToolErrorClass.EXECUTION_ERROR
    assert "image/png image of 200,008 bytes" in text_at(big)
    assert not small.is_error and isinstance(small.content[0], ImageBlock)
    assert not text.is_error
    events = [e.type for e in d.events("s1")._history if e.tool_use_id == "big"]
    assert TOOL_FAILED in events and TOOL_COMPLETED not in events
    await d.aclose()


async def test_many_text_blocks_are_cut_to_the_byte_budget(tmp_path: Any) -> None:
    d = _dispatcher(200_000)
    (result,) = await d.dispatch_all(
        [ToolUseBlock("t", "texts", {"n": 30})], Session("s1", str(tmp_path), "t1")
    )
    assert not result.is_error
    wire = sum(len(b.text.encode()) for b in result.content if isinstance(b, TextBlock))
    assert wire <= 200_000
    assert "truncated" in "".join(b.text for b in result.content if isinstance(b, TextBlock))
    await d.aclose()


async def test_results_are_always_valid_utf8(tmp_path: Any) -> None:
    d = _dispatcher(100_000)
    (result,) = await d.dispatch_all([ToolUseBlock("o", "odd", {})], Session("s1", str(tmp_path), "t1"))
    assert text_at(result) == "caf\\udce9"
    assert result.command_executed == "\\ud800"
    await d.aclose()


def test_fit_result_bounds_every_field() -> None:
    budget = 50_000
    result = ToolResultBlock(
        tool_use_id="u",
        content=(
            TextBlock("a" * 40_000),
            ImageBlock(PNG + b"\0" * 30_000, "image/png"),
            TextBlock("b" * 40_000),
        ),
        metadata={"big": "m" * 100_000},
        files_modified=tuple(f"file-{i}" * 100 for i in range(1_000)),
        command_executed="c" * 100_000,
    )
    fitted = fit_result(result, budget)
    text = sum(len(b.text) for b in fitted.content if isinstance(b, TextBlock))
    images = sum(len(b.data) for b in fitted.content if isinstance(b, ImageBlock))
    other = (
        len(fitted.command_executed or "") + sum(map(len, fitted.files_modified)) + len(str(fitted.metadata))
    )
    assert text + images + other <= budget
    assert any("left out" in b.text for b in fitted.content if isinstance(b, TextBlock))


def test_a_typed_payloads_strings_are_counted_in_the_events_size() -> None:
    bus = EventBus("s", history_bytes=1 << 30)
    small = bus.publish(ToolOutputDelta("stdout", "x"), turn_id="t", tool_use_id="u")
    big = bus.publish(ToolOutputDelta("stdout", "x" * 1_000_000), turn_id="t", tool_use_id="u")
    nested = bus.publish(ToolCalled("echo", "none", {"a": ["y" * 500_000]}), turn_id="t", tool_use_id="u")
    assert big.size >= small.size + 999_999 and nested.size >= 500_000
