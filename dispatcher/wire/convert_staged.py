"""Proto <-> domain for staged changes (review and audit modes): the changes, the apply outcome,
and the ``staged.applied`` / ``staged.discarded`` event payloads."""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.core.events import payloads as ep
from dispatcher.core.staging.area import ChangeKind
from dispatcher.core.staging.area import StagedChange as DomainChange
from dispatcher.v1 import dispatcher_pb2 as pb

__all__ = [
    "StagedApplyResult",
    "StagedChangeInfo",
    "StagedRefusal",
    "apply_result_from_pb",
    "change_from_pb",
    "change_to_pb",
    "payload_from_pb",
    "payload_to_pb",
    "refusal_to_pb",
]

_KIND_TO_PB = {
    ChangeKind.CREATE: pb.STAGED_CHANGE_KIND_CREATE,
    ChangeKind.MODIFY: pb.STAGED_CHANGE_KIND_MODIFY,
}
_KIND_FROM_PB = {v: k for k, v in _KIND_TO_PB.items()}


@dataclass(frozen=True, slots=True)
class StagedChangeInfo:
    """A staged change as a client sees it (its content stays on the server)."""

    id: str
    path: str
    kind: str  # create | modify ("" from a newer server's unknown kind)
    diff: str
    stage_time: float
    size: int
    base_sha256: str
    tool_name: str
    tool_use_id: str


@dataclass(frozen=True, slots=True)
class StagedRefusal:
    """A change ApplyStagedChanges did not write, and why."""

    id: str
    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class StagedApplyResult:
    """What ApplyStagedChanges did: the changes written, and those refused (still staged)."""

    applied_ids: tuple[str, ...]
    refused: tuple[StagedRefusal, ...]


def apply_result_from_pb(resp: pb.ApplyStagedChangesResponse) -> StagedApplyResult:
    return StagedApplyResult(
        tuple(resp.applied_ids), tuple(StagedRefusal(r.id, r.path, r.reason) for r in resp.refused)
    )


def change_to_pb(change: DomainChange) -> pb.StagedChange:
    msg = pb.StagedChange(
        id=change.change_id,
        path=change.path,
        kind=_KIND_TO_PB[change.kind],
        diff=change.diff,
        size=len(change.data),
        base_sha256=change.base_sha256,
        tool_name=change.tool_name,
        tool_use_id=change.tool_use_id,
    )
    msg.stage_time.FromNanoseconds(int(change.staged_at * 1e9))
    return msg


def change_from_pb(msg: pb.StagedChange) -> StagedChangeInfo:
    kind = _KIND_FROM_PB.get(msg.kind)
    return StagedChangeInfo(
        id=msg.id,
        path=msg.path,
        kind=kind.value if kind is not None else "",
        diff=msg.diff,
        stage_time=msg.stage_time.ToNanoseconds() / 1e9,
        size=msg.size,
        base_sha256=msg.base_sha256,
        tool_name=msg.tool_name,
        tool_use_id=msg.tool_use_id,
    )


def refusal_to_pb(change_id: str, path: str, reason: str) -> pb.StagedChangeRefusal:
    return pb.StagedChangeRefusal(id=change_id, path=path, reason=reason)


def payload_to_pb(payload: ep.StagedApplied | ep.StagedDiscarded, msg: pb.Event) -> None:
    """Set ``msg``'s payload field for a staged.* event."""
    if isinstance(payload, ep.StagedApplied):
        refused = [
            refusal_to_pb(i, p, r)
            for i, p, r in zip(
                payload.refused_ids, payload.refused_paths, payload.refused_reasons, strict=False
            )
        ]
        msg.staged_applied.CopyFrom(
            pb.StagedApplied(ids=list(payload.change_ids), paths=list(payload.paths), refused=refused)
        )
    else:
        msg.staged_discarded.CopyFrom(
            pb.StagedDiscarded(ids=list(payload.change_ids), paths=list(payload.paths))
        )


def payload_from_pb(msg: pb.Event) -> ep.StagedApplied | ep.StagedDiscarded | None:
    """The staged.* payload of ``msg``; None when it carries another kind."""
    kind = msg.WhichOneof("payload")
    if kind == "staged_applied":
        a = msg.staged_applied
        return ep.StagedApplied(
            change_ids=tuple(a.ids),
            paths=tuple(a.paths),
            refused_ids=tuple(r.id for r in a.refused),
            refused_paths=tuple(r.path for r in a.refused),
            refused_reasons=tuple(r.reason for r in a.refused),
        )
    if kind == "staged_discarded":
        d = msg.staged_discarded
        return ep.StagedDiscarded(change_ids=tuple(d.ids), paths=tuple(d.paths))
    return None
