"""A client meets an event it does not know (a newer server's kind): it skips it and keeps the
stream, instead of failing the whole call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from dispatcher.wire import convert


class _NewerServer(pb_grpc.ToolDispatcherServicer):
    async def Dispatch(self, request: pb.DispatchRequest, context: Any) -> AsyncIterator[pb.DispatchResponse]:
        tid = request.tool_uses[0].id
        yield pb.DispatchResponse(event=pb.Event(seq=1, type="tool.from_the_future", tool_use_id=tid))
        called = pb.Event(seq=2, type="tool.called", tool_use_id=tid, called=pb.ToolCalled(tool_name="echo"))
        yield pb.DispatchResponse(event=called)
        yield pb.DispatchResponse(result=pb.ToolResult(tool_use_id=tid))


def test_an_event_without_a_known_payload_converts_to_none() -> None:
    assert convert.event_from_pb(pb.Event(seq=1, type="tool.from_the_future")) is None


async def test_the_client_skips_an_unknown_event_and_still_gets_the_result() -> None:
    server = grpc.aio.server()
    # The stub marks every rpc abstract; at run time the generated base answers the others UNIMPLEMENTED.
    pb_grpc.add_ToolDispatcherServicer_to_server(_NewerServer(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        client = AsyncDispatcherClient(f"127.0.0.1:{port}", token="t")
        try:
            items = [item async for item in client.dispatch("s", [("echo", {})])]
        finally:
            await client.close()
    finally:
        await server.stop(None)
    assert [type(i) for i in items] == [Event, ToolResultBlock]
    assert isinstance(items[0], Event) and items[0].type == "tool.called" and items[0].seq == 2
