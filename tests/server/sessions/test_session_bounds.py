"""Every number a request carries is bounded before anything is stored or runs (issue 37, item 6),
and a tenant's maximum TTL bounds a session's whole life, pause and renew included (item 9)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.sessions.clock import MAX_CLOCK_SECONDS
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.events import SessionPaused, SessionResumed
from tests.polling import until
from tests.server.conftest import Harness, ServerFactory, base_config
from tests.server.helpers import next_event, text_of


async def _rpc(client: AsyncDispatcherClient, name: str, request: Any) -> Any:
    return await getattr(client._stub, name)(request, metadata=client._metadata, timeout=30)


async def _code(coro: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    return info.value.code(), info.value.details() or ""


async def _listed(client: AsyncDispatcherClient) -> list[str]:
    reply = await _rpc(client, "ListSessions", pb.ListSessionsRequest())
    return [s.session_id for s in reply.sessions]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"ttl_seconds": 10**13}, "ttl_seconds"),
        ({"ttl_seconds": 2**63 - 1}, "ttl_seconds"),
        ({"idle_timeout_seconds": 9 * 10**18}, "idle_timeout_seconds"),
        ({"idle_timeout_seconds": MAX_CLOCK_SECONDS + 1}, "idle_timeout_seconds"),
    ],
)
async def test_a_clock_past_the_bound_is_refused_and_nothing_is_stored(
    harness: Harness, fields: dict[str, Any], named: str
) -> None:
    client = harness.client()
    before = await _listed(client)
    code, details = await _code(_rpc(client, "CreateSession", pb.CreateSessionRequest(**fields)))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, details
    assert named in details and f"{MAX_CLOCK_SECONDS:,}" in details, details
    assert await _listed(client) == before  # nothing stored, the tenant still lists


async def test_the_bound_itself_is_accepted_and_listed(harness: Harness) -> None:
    client = harness.client()
    request = pb.CreateSessionRequest(ttl_seconds=MAX_CLOCK_SECONDS, idle_timeout_seconds=MAX_CLOCK_SECONDS)
    session = (await _rpc(client, "CreateSession", request)).session
    assert session.expire_time.seconds >= time.time() + MAX_CLOCK_SECONDS - 60
    assert session.session_id in await _listed(client)


async def test_a_renew_past_the_bound_is_refused_and_the_session_keeps_its_expiry(harness: Harness) -> None:
    client = harness.client()
    session = (await _rpc(client, "CreateSession", pb.CreateSessionRequest(ttl_seconds=100))).session
    request = pb.RenewSessionRequest(session_id=session.session_id, ttl_seconds=10**13)
    code, details = await _code(_rpc(client, "RenewSession", request))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "ttl_seconds" in details, details
    got = (await _rpc(client, "GetSession", pb.GetSessionRequest(session_id=session.session_id))).session
    assert got.expire_time.seconds == session.expire_time.seconds
    assert session.session_id in await _listed(client)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
async def test_a_tool_input_number_no_json_can_carry_is_invalid(harness: Harness, bad: float) -> None:
    # NaN passes a schema's "maximum" (every comparison with it is false): a shell timeout of NaN ran.
    client = harness.client()
    sid = (await client.create_session()).session_id
    result = await client.call(sid, "shell", {"command": "echo ran", "timeout_seconds": bad})
    assert result.is_error and result.error_class is ToolErrorClass.VALIDATION_ERROR, text_of(result)
    assert "not a finite number" in text_of(result)


async def _short_lived_tenant(
    make_server: ServerFactory, tmp_path: Path, maximum: float
) -> AsyncDispatcherClient:
    tenants = base_config(tmp_path)["tenants"]
    tenants[0]["max_session_ttl_seconds"] = maximum
    h = await make_server(tenants=tenants, sessions={"expiring_notice_seconds": 0})
    return h.client()


async def test_the_tenant_maximum_bounds_a_session_that_pauses_at_each_expiry(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    client = await _short_lived_tenant(make_server, tmp_path, 3)
    request = pb.CreateSessionRequest(ttl_seconds=1, on_expire=pb.ON_EXPIRE_PAUSE)
    session = (await _rpc(client, "CreateSession", request)).session
    sid, born = session.session_id, session.create_time.ToNanoseconds() / 1e9
    paused = await next_event(client, sid, SessionPaused)
    assert paused.payload.reason == "ttl"
    result = await client.call(sid, "shell", {"command": "echo back"})  # resumes it, a fresh TTL
    assert "back" in text_of(result)
    await next_event(client, sid, SessionResumed, after_seq=paused.seq)

    async def closed() -> bool:
        try:
            await _rpc(client, "GetSession", pb.GetSessionRequest(session_id=sid))
        except grpc.aio.AioRpcError as exc:
            assert exc.code() is grpc.StatusCode.NOT_FOUND, exc
            # While it closes it may briefly read as unknown (issue 37, item 2): wait for the reason.
            return "(ttl)" in (exc.details() or "")
        return False

    # Paused and resumed as often as it likes, it lives no longer than the tenant's maximum.
    await until(closed, "the session to close at the tenant's maximum", timeout=15)
    assert time.time() - born < 3 + 5
    with pytest.raises(RequestFailed) as gone:
        await client.call(sid, "shell", {"command": "echo again"})  # no resume past the end
    assert gone.value.code == "NOT_FOUND" and "(ttl)" in gone.value.details


async def test_a_renew_never_moves_the_expiry_past_the_tenant_maximum(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    client = await _short_lived_tenant(make_server, tmp_path, 600)
    session = (await _rpc(client, "CreateSession", pb.CreateSessionRequest(ttl_seconds=60))).session
    born = session.create_time.ToNanoseconds() / 1e9
    await until(lambda: time.time() > born + 0.5, "half a second of the session's life to pass")
    request = pb.RenewSessionRequest(session_id=session.session_id, ttl_seconds=600)
    renewed = (await _rpc(client, "RenewSession", request)).session.expire_time.ToNanoseconds() / 1e9
    assert born + 599.9 <= renewed <= born + 600.1  # to the end of its life, not 600 s from now
