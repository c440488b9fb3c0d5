"""Each RPC of dispatcher.v1.ToolDispatcher against a real server, plus health and reflection."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.core.dispatcher import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import to_dict
from dispatcher.core.types import Role, SideEffect, TextBlock, ToolResultBlock, ToolUseBlock
from tests.blocks import text_at
from tests.events import ToolConfirmationRequested, is_event
from tests.polling import until
from tests.server.conftest import Harness


async def test_session_lifecycle(harness: Harness) -> None:
    client = harness.client()
    created = await client.create_session("proj/one", role=Role.WORKER, labels={"who": "test"})
    assert created.session_id.startswith("ses_")
    assert created.workspace == "proj/one"
    assert created.workspace_path == str((harness.tmp / "ws-alpha" / "proj" / "one").resolve())
    assert (harness.tmp / "ws-alpha" / "proj" / "one").is_dir()
    got = await client.get_session(created.session_id)
    assert (got.role, dict(got.labels), got.last_event_seq) == (Role.WORKER, {"who": "test"}, 0)
    other = await client.create_session()
    assert other.workspace == "default"
    assert [s.session_id for s in await client.list_sessions()] == [created.session_id, other.session_id]

    await client.close_session(created.session_id)
    assert [s.session_id for s in await client.list_sessions()] == [other.session_id]
    assert (harness.tmp / "ws-alpha" / "proj" / "one").is_dir()  # the workspace stays
    with pytest.raises(RequestFailed) as err:
        await client.get_session(created.session_id)
    assert err.value.code == "NOT_FOUND"


async def test_list_tools(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    tools = {t.name: t for t in await client.list_tools(session.session_id)}
    assert {"read_file", "write_file", "patch_file", "list_dir", "shell", "echo", "block"} <= set(tools)
    assert tools["read_file"].side_effect is SideEffect.READ
    assert tools["shell"].side_effect is SideEffect.EXECUTE
    assert tools["read_file"].input_schema["required"] == ["path"]
    assert list(tools) == sorted(tools)


async def test_dispatch_streams_events_then_one_result_per_tool_use(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    uses = [
        ToolUseBlock("a", "echo", {"text": "one", "n": 2**53 + 1}),
        ToolUseBlock("b", "echo", {"text": "two"}),
    ]
    items = [i async for i in client.dispatch(session.session_id, uses, turn_id="turn-1")]
    results = {i.tool_use_id: i for i in items if isinstance(i, ToolResultBlock)}
    assert set(results) == {"a", "b"}
    assert results["a"].content == (TextBlock("one"),)
    assert results["a"].metadata == {"n": 2**53 + 1}  # input_json keeps big integers exact
    events = [i for i in items if isinstance(i, Event)]
    assert all(e.turn_id == "turn-1" and e.session_id == session.session_id for e in events)
    for tid in ("a", "b"):
        kinds = [e.type for e in events if e.tool_use_id == tid]
        assert kinds == ["tool.called", "tool.completed"]
        # a result comes after every event of its own call
        last_event = max(n for n, i in enumerate(items) if isinstance(i, Event) and i.tool_use_id == tid)
        assert items.index(results[tid]) > last_event
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert to_dict(events[0].payload) == {
        "tool_name": "echo",
        "side_effect": SideEffect.NONE,
        "input": {"text": "one", "n": 2**53 + 1},
    }


async def test_unknown_tool_is_a_result_not_an_error(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    result = await client.call(session.session_id, "no_such_tool", {})
    assert result.is_error and str(result.error_class) == "not_found"


async def test_cancel_session_tools(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    started = asyncio.Event()

    def on_event(event: Event) -> None:
        if event.type == "tool.output_delta":
            started.set()

    call = asyncio.create_task(client.call(session.session_id, "block", {}, on_event=on_event))
    await asyncio.wait_for(started.wait(), 10)
    await harness.client().cancel(session.session_id)
    result = await asyncio.wait_for(call, 10)
    assert result.is_error and str(result.error_class) == "cancelled"
    assert "blocking" in text_at(result, -1)


async def test_resolve_confirmation_first_answer_wins(harness: Harness) -> None:
    agent, human, other = harness.client(), harness.client(), harness.client()
    session = await agent.create_session()
    call = asyncio.create_task(
        agent.call(session.session_id, "write_file", {"path": "x.txt", "content": "hi"})
    )
    request_id = await _next_confirmation(human, session.session_id)
    assert await human.resolve_confirmation(session.session_id, request_id, Decision.ALLOW) == (
        True,
        Decision.ALLOW,
    )
    assert await other.resolve_confirmation(session.session_id, request_id, Decision.DENY) == (
        False,
        Decision.ALLOW,
    )
    result = await asyncio.wait_for(call, 20)
    assert not result.is_error, result
    assert (harness.tmp / "ws-alpha" / "default" / "x.txt").read_text() == "hi"
    with pytest.raises(RequestFailed) as err:
        await human.resolve_confirmation(session.session_id, "no-such-request", Decision.ALLOW)
    assert err.value.code == "NOT_FOUND"


async def test_watch_session_replays_from_after_seq_then_follows_live(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    await client.call(session.session_id, "echo", {"text": "first"}, tool_use_id="t1")
    first_seq = (await client.get_session(session.session_id)).last_event_seq
    assert first_seq == 2
    seen: list[Event] = []

    async def follow() -> None:
        async for event in client.watch(session.session_id, after_seq=1):
            seen.append(event)
            if event.tool_use_id == "t2" and event.type == "tool.completed":
                return

    watcher = asyncio.create_task(follow())
    await until(lambda: len(seen) >= 1, "the first event")
    await client.call(session.session_id, "echo", {"text": "second"}, tool_use_id="t2")
    await asyncio.wait_for(watcher, 10)
    assert [(e.seq, e.tool_use_id, e.type) for e in seen] == [
        (2, "t1", "tool.completed"),
        (3, "t2", "tool.called"),
        (4, "t2", "tool.completed"),
    ]


async def test_watch_ends_when_the_session_closes(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()

    async def follow() -> list[Event]:
        return [e async for e in client.watch(session.session_id)]

    watcher = asyncio.create_task(follow())
    await client.call(session.session_id, "echo", {"text": "x"})
    await client.close_session(session.session_id)
    assert [e.type for e in await asyncio.wait_for(watcher, 10)] == ["tool.called", "tool.completed"]


async def test_health_and_reflection_need_no_token(harness: Harness) -> None:
    async with grpc.aio.insecure_channel(harness.target) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "dispatcher.v1.ToolDispatcher"):
            resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name async for r in responses for s in r.list_services_response.service}
        assert "dispatcher.v1.ToolDispatcher" in names and "grpc.health.v1.Health" in names


async def _next_confirmation(client: AsyncDispatcherClient, session_id: str, after_seq: int = 0) -> str:
    async for event in client.watch(session_id, after_seq=after_seq):
        if is_event(event, ToolConfirmationRequested):
            return event.payload.request_id
    raise AssertionError("session closed before a confirmation was requested")
