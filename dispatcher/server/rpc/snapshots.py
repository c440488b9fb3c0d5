"""The snapshot RPCs: SnapshotSession, ListSnapshots, DeleteSnapshot and ForkSession
(``sessions/snapshots/``); CreateSession from a snapshot refuses as they do without snapshots."""

from __future__ import annotations

from dispatcher.server.requests.errors import FailedPrecondition
from dispatcher.server.rpc.handlers import Ctx, RpcArea, unary
from dispatcher.server.sessions.snapshots import Snapshots
from dispatcher.server.tenancy.auth import current_tenant
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert_snapshots


class SnapshotRpcs(RpcArea):
    """SnapshotSession, ListSnapshots, DeleteSnapshot and ForkSession."""

    _snapshots: Snapshots | None

    def _snapshots_or_refuse(self) -> Snapshots:
        if self._snapshots is None:
            raise FailedPrecondition("this server keeps no snapshots")
        return self._snapshots

    @unary
    async def SnapshotSession(self, request: pb.SnapshotSessionRequest, context: Ctx) -> pb.Snapshot:
        info = await self._snapshots_or_refuse().take(current_tenant(), request.session_id, request.name)
        return convert_snapshots.snapshot_to_pb(info)

    @unary
    async def ListSnapshots(self, request: pb.ListSnapshotsRequest, context: Ctx) -> pb.ListSnapshotsResponse:
        found = self._snapshots_or_refuse().list_for(current_tenant())
        return pb.ListSnapshotsResponse(snapshots=[convert_snapshots.snapshot_to_pb(s) for s in found])

    @unary
    async def DeleteSnapshot(
        self, request: pb.DeleteSnapshotRequest, context: Ctx
    ) -> pb.DeleteSnapshotResponse:
        freed = await self._snapshots_or_refuse().delete(current_tenant(), request.snapshot_id)
        return pb.DeleteSnapshotResponse(freed_bytes=freed)

    @unary
    async def ForkSession(self, request: pb.ForkSessionRequest, context: Ctx) -> pb.ForkSessionResponse:
        results = await self._snapshots_or_refuse().fork(
            current_tenant(),
            session_id=request.session_id,
            snapshot_id=request.snapshot_id,
            count=request.count,
            labels=dict(request.labels),
            ttl_seconds=float(request.ttl_seconds) if request.HasField("ttl_seconds") else None,
            idle_timeout_seconds=(
                float(request.idle_timeout_seconds) if request.HasField("idle_timeout_seconds") else None
            ),
        )
        return pb.ForkSessionResponse(
            results=[
                convert_snapshots.fork_result_to_pb(
                    r if isinstance(r, convert_snapshots.ForkFailure) else self._sessions.info(r)
                )
                for r in results
            ]
        )
