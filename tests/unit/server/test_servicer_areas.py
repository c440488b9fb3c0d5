"""The servicer composes one mixin per area of RPCs: every RPC of the service must resolve to a
handler of ours, never to the generated base's UNIMPLEMENTED stub (a mixin left out of the
servicer's bases, or placed after the generated base, would do that silently)."""

from __future__ import annotations

from dispatcher.server.rpc.servicer import DispatcherServicer
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc


def test_every_rpc_of_the_service_has_a_handler_of_the_servicer() -> None:
    names = [m.name for m in pb.DESCRIPTOR.services_by_name["ToolDispatcher"].methods]
    generated = pb_grpc.ToolDispatcherServicer
    unimplemented = [n for n in names if getattr(DispatcherServicer, n) is getattr(generated, n)]
    assert names and not unimplemented, f"RPCs answered UNIMPLEMENTED: {unimplemented}"
