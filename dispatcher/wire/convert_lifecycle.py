"""Proto <-> domain for sessions' lives: the session.* events, session state and clocks."""

from __future__ import annotations

from dispatcher.core.events import payloads as ep
from dispatcher.core.sessions.clock import ExpiryReason, OnExpire
from dispatcher.v1 import dispatcher_pb2 as pb

SessionEventPayload = ep.SessionExpiring | ep.SessionExpired | ep.SessionPaused | ep.SessionResumed
SESSION_PAYLOADS = (ep.SessionExpiring, ep.SessionExpired, ep.SessionPaused, ep.SessionResumed)

_REASON_TO_PB = {r.value: pb.ExpiryReason.Value(f"EXPIRY_REASON_{r.name}") for r in ExpiryReason}
_REASON_FROM_PB = {v: k for k, v in _REASON_TO_PB.items()}
_ON_EXPIRE_FROM_PB: dict[int, OnExpire] = {
    pb.ON_EXPIRE_CLOSE: OnExpire.CLOSE,
    pb.ON_EXPIRE_PAUSE: OnExpire.PAUSE,
}


def reason_to_pb(reason: str) -> pb.ExpiryReason.ValueType:
    return _REASON_TO_PB.get(reason, pb.EXPIRY_REASON_UNSPECIFIED)


def on_expire_from_pb(value: int) -> OnExpire | None:
    """None: unspecified (the server's default)."""
    if value not in _ON_EXPIRE_FROM_PB and value != pb.ON_EXPIRE_UNSPECIFIED:
        raise ValueError(f"on_expire: unknown value {value}")
    return _ON_EXPIRE_FROM_PB.get(value)


def state_to_pb(paused: bool) -> pb.SessionState.ValueType:
    return pb.SESSION_STATE_PAUSED if paused else pb.SESSION_STATE_ACTIVE


def session_event_to_pb(msg: pb.Event, p: SessionEventPayload) -> None:
    """Set ``msg``'s payload from a session.* event's."""
    if isinstance(p, ep.SessionExpiring):
        out = pb.SessionExpiring(reason=reason_to_pb(p.reason), seconds_left=p.seconds_left)
        out.expire_time.FromNanoseconds(int(p.expire_time * 1e9))
        msg.session_expiring.CopyFrom(out)
    elif isinstance(p, ep.SessionExpired):
        msg.session_expired.CopyFrom(pb.SessionExpired(reason=reason_to_pb(p.reason)))
    elif isinstance(p, ep.SessionPaused):
        msg.session_paused.CopyFrom(pb.SessionPaused(reason=reason_to_pb(p.reason)))
    else:
        msg.session_resumed.CopyFrom(pb.SessionResumed(reason=reason_to_pb(p.reason)))


def session_event_from_pb(msg: pb.Event) -> SessionEventPayload | None:
    """The session.* payload of ``msg``; None when it carries another (or an unknown) one."""
    kind = msg.WhichOneof("payload")
    if kind == "session_expiring":
        e = msg.session_expiring
        return ep.SessionExpiring(
            _REASON_FROM_PB.get(e.reason, ""), e.seconds_left, e.expire_time.ToNanoseconds() / 1e9
        )
    if kind == "session_expired":
        return ep.SessionExpired(_REASON_FROM_PB.get(msg.session_expired.reason, ""))
    if kind == "session_paused":
        return ep.SessionPaused(_REASON_FROM_PB.get(msg.session_paused.reason, ""))
    if kind == "session_resumed":
        return ep.SessionResumed(_REASON_FROM_PB.get(msg.session_resumed.reason, ""))
    return None
