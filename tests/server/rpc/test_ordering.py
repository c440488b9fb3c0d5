"""Issue 22 item 1 through gRPC: DispatchRequest.ordering, the server's ``dispatch.ordering``
default, and plan steps numbered in message order."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.server.conftest import Harness, ServerFactory
from tests.server.helpers import text_of

Item = Event | ToolResultBlock
_AUTO = {"default": {"WRITE": "auto", "EXECUTE": "auto"}}
_TOOLS = [
    "tests.server.tools:make_echo_tool",
    "tests.server.tools:make_block_tool",
    "tests.server.order_tools:make_meet_tool",
]


@pytest.fixture
async def auto(make_server: ServerFactory) -> Harness:
    """Writes and shell run unasked, and the ``meet`` tool is registered."""
    return await make_server(tool_confirmation=_AUTO, tools=_TOOLS)


async def _dispatch(
    client: AsyncDispatcherClient,
    session_id: str,
    calls: list[tuple[str, dict[str, Any]]],
    ordering: str | None,
) -> tuple[list[Item], dict[str, ToolResultBlock]]:
    uses = [ToolUseBlock(f"t{i}", name, tool_input) for i, (name, tool_input) in enumerate(calls)]
    items = [item async for item in client.dispatch(session_id, uses, ordering=ordering)]
    return items, {i.tool_use_id: i for i in items if isinstance(i, ToolResultBlock)}


def _seq(items: list[Item], tool_use_id: str, event_type: str) -> int:
    (seq,) = [
        i.seq for i in items if isinstance(i, Event) and i.tool_use_id == tool_use_id and i.type == event_type
    ]
    return seq


@pytest.mark.parametrize("ordering", ["sequential", "reads_concurrent"])
async def test_write_then_run_sees_the_file_every_time(auto: Harness, ordering: str) -> None:
    client = auto.client()
    info = await client.create_session("order-" + ordering)
    for run in range(5):
        text = f"run {run}\n"
        calls = [
            ("write_file", {"path": "dep.txt", "content": text}),
            ("shell", {"command": "cat dep.txt"}),
        ]
        _, results = await _dispatch(client, info.session_id, calls, ordering)
        assert not results["t0"].is_error, text_of(results["t0"])
        assert not results["t1"].is_error and text_of(results["t1"]) == text, text_of(results["t1"])
        await client.call(info.session_id, "shell", {"command": "rm dep.txt"})


async def test_reads_stay_concurrent_around_a_write(auto: Harness) -> None:
    client = auto.client()
    info = await client.create_session("reads")
    before, after = uuid.uuid4().hex, uuid.uuid4().hex
    calls: list[tuple[str, dict[str, Any]]] = [
        ("meet", {"group": before, "n": 2}),
        ("meet", {"group": before, "n": 2}),  # met: the two reads ran at the same time
        ("write_file", {"path": "w.txt", "content": "x"}),
        ("meet", {"group": after, "n": 2}),
        ("meet", {"group": after, "n": 2}),
    ]
    items, results = await _dispatch(client, info.session_id, calls, "reads_concurrent")
    assert [text_of(results[f"t{i}"]) for i in (0, 1, 3, 4)] == ["met"] * 4
    write_called = _seq(items, "t2", "tool.called")
    write_done = _seq(items, "t2", "tool.completed")
    assert write_called > max(_seq(items, t, "tool.completed") for t in ("t0", "t1"))
    assert write_done < min(_seq(items, t, "tool.called") for t in ("t3", "t4"))


async def test_sequential_runs_reads_one_after_another(auto: Harness) -> None:
    client = auto.client()
    info = await client.create_session("seq")
    calls = [("echo", {"text": str(i)}) for i in range(4)]
    items, results = await _dispatch(client, info.session_id, calls, "sequential")
    assert [text_of(results[f"t{i}"]) for i in range(4)] == ["0", "1", "2", "3"]
    for i in range(3):
        assert _seq(items, f"t{i}", "tool.completed") < _seq(items, f"t{i + 1}", "tool.called")


async def test_concurrent_is_the_default_and_the_server_config_changes_it(
    auto: Harness, make_server: ServerFactory
) -> None:
    group = uuid.uuid4().hex
    calls = [("meet", {"group": group, "n": 2}), ("meet", {"group": group, "n": 2})]
    client = auto.client()
    info = await client.create_session("default")
    _, results = await _dispatch(client, info.session_id, calls, None)
    assert [text_of(r) for r in results.values()] == ["met", "met"]  # spec 000 §4.1: at once

    sequential = await make_server(
        home=str(auto.tmp / "home-sequential"),
        tool_confirmation=_AUTO,
        tools=_TOOLS,
        dispatch={"ordering": "sequential"},
    )
    client = sequential.client()
    info = await client.create_session("configured")
    calls = [("write_file", {"path": "dep.txt", "content": "ok"}), ("shell", {"command": "cat dep.txt"})]
    _, results = await _dispatch(client, info.session_id, calls, None)
    assert text_of(results["t1"]) == "ok"


async def test_an_unknown_ordering_is_invalid_argument(auto: Harness) -> None:
    client = auto.client()
    info = await client.create_session("bad")
    request = pb.DispatchRequest(
        session_id=info.session_id, tool_uses=[pb.ToolUse(id="a", name="echo", input_json='{"text": "x"}')]
    )
    request.ordering = 99  # type: ignore[assignment]
    with pytest.raises(RequestFailed) as failed:
        async for _ in client._stream(client._stub.Dispatch(request, metadata=client._metadata), lambda r: r):
            pass
    assert failed.value.code == "INVALID_ARGUMENT" and "ordering" in failed.value.details


async def test_plan_steps_are_numbered_in_message_order(harness: Harness) -> None:
    client = harness.client()
    info = await client.create_session("plan", mode="plan")
    # write_file resolves its path in the sandbox before it is proposed; shell without a cwd has
    # nothing to resolve, so it used to be proposed first and become step 1.
    calls = [
        ("write_file", {"path": "a.txt", "content": "a"}),
        ("shell", {"command": "make"}),
        ("echo", {"text": "reads still run"}),
        ("write_file", {"path": "b.txt", "content": "b"}),
    ]
    _, results = await _dispatch(client, info.session_id, calls, None)
    assert [results[t].reason for t in ("t0", "t1", "t3")] == ["plan_proposed"] * 3
    assert not results["t2"].is_error
    plan = (await client.get_session(info.session_id)).plan
    assert [(s.step, s.tool_use_id) for s in plan] == [(1, "t0"), (2, "t1"), (3, "t3")]
