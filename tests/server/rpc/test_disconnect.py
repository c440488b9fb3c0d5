"""A client that goes away mid-Dispatch gets its tools cancelled; other calls are unaffected."""

from __future__ import annotations

import asyncio

import grpc

from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from tests.events import ToolFailed, ToolOutputDelta
from tests.server.conftest import TOKEN_ALPHA, Harness
from tests.server.helpers import next_event

AUTH = (("authorization", f"Bearer {TOKEN_ALPHA}"),)


async def _start_and_abandon(harness: Harness, session_id: str, tool_use: pb.ToolUse) -> None:
    """Start a Dispatch, wait until the tool printed something, then cancel the RPC."""
    async with grpc.aio.insecure_channel(harness.target) as channel:
        stub = pb_grpc.ToolDispatcherStub(channel)
        call = stub.Dispatch(pb.DispatchRequest(session_id=session_id, tool_uses=[tool_use]), metadata=AUTH)
        async for resp in call:
            if resp.WhichOneof("item") == "event" and resp.event.type == "tool.output_delta":
                break
        call.cancel()


async def test_disconnect_cancels_the_calls_tools(harness: Harness) -> None:
    watcher = harness.client()
    session = await watcher.create_session()
    use = pb.ToolUse(id="gone", name="block", input_json="{}")
    await _start_and_abandon(harness, session.session_id, use)
    failed = await next_event(watcher, session.session_id, ToolFailed)
    assert failed.tool_use_id == "gone" and str(failed.payload.error_class) == "cancelled"


async def test_disconnect_kills_a_running_shell(harness: Harness) -> None:
    watcher = harness.client()
    session = await watcher.create_session()
    use = pb.ToolUse(id="sh", name="shell", input_json='{"command": "echo up; sleep 60"}')
    began = asyncio.get_running_loop().time()
    await _start_and_abandon(harness, session.session_id, use)
    failed = await next_event(watcher, session.session_id, ToolFailed)
    assert failed.tool_use_id == "sh" and str(failed.payload.error_class) == "cancelled"
    assert asyncio.get_running_loop().time() - began < 10
    # the session still works
    result = await watcher.call(session.session_id, "shell", {"command": "echo fine"})
    assert not result.is_error


async def test_disconnect_leaves_other_calls_alone(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session()
    survivor = asyncio.create_task(client.call(session.session_id, "block", {}, tool_use_id="stays"))
    await next_event(client, session.session_id, ToolOutputDelta)
    await _start_and_abandon(
        harness, session.session_id, pb.ToolUse(id="gone", name="block", input_json="{}")
    )
    failed = await next_event(client, session.session_id, ToolFailed)
    assert failed.tool_use_id == "gone"
    assert not survivor.done()
    await client.cancel(session.session_id)
    assert (await asyncio.wait_for(survivor, 10)).tool_use_id == "stays"
