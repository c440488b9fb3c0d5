"""Snapshots and forks (``SnapshotSession``, ``ListSnapshots``, ``ForkSession``) between proto and
the domain."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert
from dispatcher.wire.convert import SessionInfo

__all__ = [
    "ForkFailure",
    "SnapshotInfo",
    "fork_result_from_pb",
    "fork_result_to_pb",
    "snapshot_from_pb",
    "snapshot_to_pb",
]


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """A snapshot of a session: its workspace and /tmp, kept for its tenant."""

    snapshot_id: str
    name: str
    tenant: str
    source_session_id: str
    create_time: float
    size_bytes: int
    has_tmp: bool = False
    """The source had a running sandbox, so its /tmp was copied (else only the workspace); the
    server's own."""


@dataclass(frozen=True, slots=True)
class ForkFailure:
    """Why one child of a fork was not made: the status code a create would have had."""

    code: str
    message: str


def snapshot_to_pb(info: SnapshotInfo) -> pb.Snapshot:
    msg = pb.Snapshot(
        snapshot_id=info.snapshot_id,
        name=info.name,
        tenant=info.tenant,
        source_session_id=info.source_session_id,
        size_bytes=info.size_bytes,
    )
    msg.create_time.FromNanoseconds(int(info.create_time * 1e9))
    return msg


def snapshot_from_pb(msg: pb.Snapshot) -> SnapshotInfo:
    return SnapshotInfo(
        snapshot_id=msg.snapshot_id,
        name=msg.name,
        tenant=msg.tenant,
        source_session_id=msg.source_session_id,
        create_time=msg.create_time.ToNanoseconds() / 1e9,
        size_bytes=msg.size_bytes,
    )


def fork_result_to_pb(result: SessionInfo | ForkFailure) -> pb.ForkResult:
    if isinstance(result, ForkFailure):
        return pb.ForkResult(error=pb.ForkError(code=result.code, message=result.message))
    return pb.ForkResult(session=convert.session_to_pb(result))


def fork_result_from_pb(msg: pb.ForkResult) -> SessionInfo | ForkFailure:
    if msg.WhichOneof("result") == "session":
        return convert.session_from_pb(msg.session)
    return ForkFailure(msg.error.code, msg.error.message)
