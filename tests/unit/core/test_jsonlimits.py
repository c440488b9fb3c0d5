"""Tool inputs too deep or too large in values are refused before anything recursive runs."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import pytest

from dispatcher.core import MemoryAuditLog, Session, ToolDispatcher, ToolErrorClass
from dispatcher.core.events import bus as ev
from dispatcher.core.jsonlimits import MAX_DEPTH, MAX_VALUES, InputShapeError, loads, shape_problem
from dispatcher.core.types import ToolUseBlock
from dispatcher.sandbox.fake import FakeSandboxProvider
from tests.events import ToolInputInvalid, event_of
from tests.unit.core.toolkit import EchoTool


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def test_depth_limit_is_exact() -> None:
    assert loads(nested(MAX_DEPTH)) is not None
    with pytest.raises(InputShapeError, match=f"deeper than {MAX_DEPTH}"):
        loads(nested(MAX_DEPTH + 1))


@pytest.mark.parametrize("depth", [900, 989, 5000, 100_000])
def test_deep_nesting_is_refused_unparsed(depth: int) -> None:
    with pytest.raises(InputShapeError):
        loads('{"text": ' + nested(depth) + "}")


def test_brackets_and_quotes_inside_strings_do_not_count() -> None:
    text = '[[[[\\"\\\\' + "{" * 500 + '"'
    value = {"text": text, "more": ["a,b,c" * 5000]}
    assert loads(json.dumps(value)) == value


def test_too_many_values_is_refused() -> None:
    with pytest.raises(InputShapeError, match="more than"):
        loads(json.dumps({"text": [0] * MAX_VALUES}))
    with pytest.raises(InputShapeError, match="more than"):
        loads(json.dumps({"text": ["a"] * MAX_VALUES}))
    assert len(loads(json.dumps({"text": [0] * (MAX_VALUES - 10)}))["text"]) == MAX_VALUES - 10


@pytest.mark.parametrize("raw", ["[1, 2", "]]]]" * 10_000, '{"a": "unclosed'])
def test_invalid_json_is_still_a_value_error(raw: str) -> None:
    with pytest.raises(ValueError):
        loads(raw)


@pytest.mark.parametrize(
    "raw", ['{"t": NaN}', '{"t": Infinity}', '{"t": -Infinity}', '{"t": 1e400}', "[-1e999]"]
)
def test_a_number_no_json_can_carry_is_refused(raw: str) -> None:
    # NaN passes every "maximum" of a schema (every comparison with it is false).
    with pytest.raises(ValueError, match="not a finite number"):
        loads(raw)
    assert loads('{"t": 1e308, "u": -2.5, "v": 10}') == {"t": 1e308, "u": -2.5, "v": 10}


def test_a_4_mib_hostile_document_is_refused_in_the_time_of_a_harmless_one() -> None:
    size = 4 << 20
    hostile = ["[" + "[]," * (size // 3) + "[]]", json.dumps(["a"] * (size // 4)), nested(size // 2)]
    harmless = json.dumps({"text": "x" * size})

    def best(raw: str) -> float:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            with contextlib.suppress(ValueError):
                loads(raw)
            times.append(time.perf_counter() - start)
        return min(times)

    baseline = best(harmless)
    for raw in hostile:
        assert best(raw) <= 25 * baseline + 0.05


def test_shape_of_an_in_process_value() -> None:
    deep: Any = 1
    for _ in range(2000):
        deep = [deep]
    assert shape_problem(deep) == f"it is nested deeper than {MAX_DEPTH} levels"
    assert shape_problem({"a": list(range(MAX_VALUES))}) == f"it has more than {MAX_VALUES:,} JSON values"
    assert shape_problem({"a": [[1, 2], {"b": "c"}]}) is None


@pytest.mark.parametrize("depth", [900, 989, 5000])
async def test_a_deep_in_process_input_is_a_validation_error_with_its_audit_record(
    depth: int, tmp_path: Any
) -> None:
    deep: Any = "x"
    for _ in range(depth):
        deep = {"a": deep}
    audit = MemoryAuditLog()
    d = ToolDispatcher(FakeSandboxProvider(), audit=audit)
    d.register(EchoTool)
    session = Session(session_id="s1", workspace_path=str(tmp_path), tenant_id="t1")
    for name in ("echo", "no_such_tool"):
        result = await d.dispatch(ToolUseBlock("tu", name, {"text": deep}), session)
        expected = ToolErrorClass.VALIDATION_ERROR if name == "echo" else ToolErrorClass.NOT_FOUND
        assert result.error_class is expected
        record = audit.records[-1]
        assert record["tool"] == name and record["outcome"] == expected.value
        json.dumps(record)  # the record is writable
    events = list(d.events("s1").subscribe(after_seq=0)._pending)
    assert events[0].type == ev.TOOL_INPUT_INVALID
    assert "nested deeper than" in event_of(events[0], ToolInputInvalid).payload.errors[0]
    await d.aclose()
