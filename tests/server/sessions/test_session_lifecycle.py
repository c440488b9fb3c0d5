"""Session clocks through gRPC (local backend): idle and TTL expiry, renew, pause and resume,
retry-safe create, and waiting for a dispatch slot."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.errors import ToolErrorClass
from dispatcher.core.types import ToolResultBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.events import SessionExpired, SessionExpiring, SessionPaused, SessionResumed, ToolCalled
from tests.polling import until
from tests.server.conftest import TOKEN_BETA, TOKEN_TINY, Harness, ServerFactory, base_config
from tests.server.helpers import next_event, text_of


def _stub(client: AsyncDispatcherClient) -> Any:
    return client._stub


async def _rpc(client: AsyncDispatcherClient, name: str, request: Any) -> Any:
    return await getattr(_stub(client), name)(request, metadata=client._metadata, timeout=30)


async def _create(client: AsyncDispatcherClient, **fields: Any) -> pb.Session:
    reply: pb.CreateSessionResponse = await _rpc(client, "CreateSession", pb.CreateSessionRequest(**fields))
    return reply.session


async def _code(coro: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await coro
    return info.value.code(), info.value.details() or ""


async def test_an_idle_session_warns_then_expires_and_says_so(make_server: ServerFactory) -> None:
    h = await make_server(sessions={"idle_timeout_seconds": 1, "expiring_notice_seconds": 0.5})
    client = h.client()
    session = await _create(client)
    sid = session.session_id
    assert session.state == pb.SESSION_STATE_ACTIVE and session.HasField("idle_expire_time")
    started = time.monotonic()
    expiring = await next_event(client, sid, SessionExpiring)
    assert expiring.payload.reason == "idle" and 0 <= expiring.payload.seconds_left <= 0.5
    expired = await next_event(client, sid, SessionExpired, after_seq=expiring.seq)
    assert expired.payload.reason == "idle"
    assert time.monotonic() - started < 5
    code, details = await _code(_rpc(client, "GetSession", pb.GetSessionRequest(session_id=sid)))
    assert code is grpc.StatusCode.NOT_FOUND and "expired at" in details and "(idle)" in details
    # Another tenant is not told it existed.
    code, details = await _code(
        _rpc(h.client(TOKEN_TINY), "GetSession", pb.GetSessionRequest(session_id=sid))
    )
    assert code is grpc.StatusCode.NOT_FOUND and "expired" not in details


async def test_renew_moves_the_deadline(harness: Harness) -> None:
    client = harness.client()
    session = await _create(client, ttl_seconds=100)
    first = session.expire_time.seconds
    request = pb.RenewSessionRequest(session_id=session.session_id, ttl_seconds=5000)
    renewed = (await _rpc(client, "RenewSession", request)).session
    assert renewed.expire_time.seconds - first >= 4899
    code, _ = await _code(_create(client, ttl_seconds=-1))
    assert code is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_ttl_above_the_tenant_maximum_is_refused_naming_it(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    tenants = base_config(tmp_path)["tenants"]
    tenants[0]["max_session_ttl_seconds"] = 3600
    client = (await make_server(tenants=tenants)).client()
    code, details = await _code(_create(client, ttl_seconds=7200))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "maximum of 3600 s" in details
    session = await _create(client)  # the server's default (24 h) is cut to the maximum
    assert 3500 < session.expire_time.seconds - time.time() <= 3600
    request = pb.RenewSessionRequest(session_id=session.session_id, ttl_seconds=0)
    code, details = await _code(_rpc(client, "RenewSession", request))
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "3600" in details


async def test_ttl_expiry_during_a_call_cancels_it_keeping_its_output(make_server: ServerFactory) -> None:
    h = await make_server()
    client = h.client()
    sid = (await _create(client, ttl_seconds=1)).session_id
    result = await client.call(sid, "block", {})
    assert result.is_error and result.error_class is ToolErrorClass.CANCELLED
    assert "blocking" in text_of(result)  # partial output kept, as CancelSessionTools does
    code, details = await _code(_rpc(client, "GetSession", pb.GetSessionRequest(session_id=sid)))
    assert code is grpc.StatusCode.NOT_FOUND and "(ttl)" in details


async def test_pause_then_a_call_resumes_it_and_says_so(harness: Harness) -> None:
    client = harness.client()
    sid = (await _create(client)).session_id
    paused = (await _rpc(client, "PauseSession", pb.PauseSessionRequest(session_id=sid))).session
    assert paused.state == pb.SESSION_STATE_PAUSED and not paused.HasField("idle_expire_time")
    listed = (await _rpc(client, "ListSessions", pb.ListSessionsRequest())).sessions
    assert [s.state for s in listed if s.session_id == sid] == [pb.SESSION_STATE_PAUSED]
    result = await client.call(sid, "shell", {"command": "echo hi"})
    assert "was paused and has been resumed" in text_of(result).splitlines()[0]
    assert "hi" in text_of(result)
    got = (await _rpc(client, "GetSession", pb.GetSessionRequest(session_id=sid))).session
    assert got.state == pb.SESSION_STATE_ACTIVE
    paused_event = await next_event(client, sid, SessionPaused)
    resumed = await next_event(client, sid, SessionResumed)
    assert paused_event.payload.reason == resumed.payload.reason == "request"
    again = (await _rpc(client, "ResumeSession", pb.ResumeSessionRequest(session_id=sid))).session
    assert again.state == pb.SESSION_STATE_ACTIVE  # resuming a running session: nothing


async def test_a_retried_create_gets_the_same_session(harness: Harness) -> None:
    client = harness.client()
    first = await _create(client, request_id="req-1", labels={"a": "b"})
    again = await _create(client, request_id="req-1", labels={"a": "b"})
    assert again.session_id == first.session_id
    code, details = await _code(_create(client, request_id="req-1", labels={"a": "c"}))
    assert code is grpc.StatusCode.ALREADY_EXISTS and "req-1" in details
    other = await _create(harness.client(TOKEN_TINY), request_id="req-1")  # ids are per tenant
    assert other.session_id != first.session_id


async def test_a_dispatch_waits_for_a_slot_in_line_then_is_refused(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    tenants = base_config(tmp_path)["tenants"]
    tenants[2]["quotas"] = {"max_sessions": 5, "max_concurrent_dispatches": 1, "queue_timeout_seconds": 0.5}
    h = await make_server(tenants=tenants)
    client = h.client(TOKEN_TINY)
    a = (await _create(client)).session_id
    b = (await _create(client)).session_id
    holder = asyncio.create_task(client.call(a, "block", {}))
    await next_event(client, a, ToolCalled)
    started = time.monotonic()
    with pytest.raises(Exception) as refused:
        await client.call(b, "echo", {"text": "x"})
    assert "RESOURCE_EXHAUSTED" in str(refused.value) and "waited 0.5 s" in str(refused.value)
    assert time.monotonic() - started >= 0.45
    # A slot freed while it waits is handed over: the waiting call runs.
    waiting = asyncio.create_task(client.call(b, "echo", {"text": "x"}))
    await asyncio.sleep(0)
    await _rpc(client, "CancelSessionTools", pb.CancelSessionToolsRequest(session_id=a))
    assert isinstance(await holder, ToolResultBlock)
    assert not (await waiting).is_error


async def test_polling_across_an_idle_expiry_never_hears_no_such_session(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await make_server(sessions={"idle_timeout_seconds": 1, "expiring_notice_seconds": 0})
    client = h.client()
    sid = (await _create(client)).session_id
    provider = h.server.provider
    stop = provider.close_session
    stopping, answers_while_stopping = asyncio.Event(), asyncio.Event()

    async def slow_stop(session_id: str) -> None:
        # A container takes a while to stop (Docker: about 50 ms): held until polled in that window.
        stopping.set()
        await answers_while_stopping.wait()
        await stop(session_id)

    monkeypatch.setattr(provider, "close_session", slow_stop)
    answers: list[str] = []

    async def poll() -> bool:
        try:
            await _rpc(client, "GetSession", pb.GetSessionRequest(session_id=sid))
            answers.append("live")
        except grpc.aio.AioRpcError as exc:
            answers.append(f"{exc.code().name}: {exc.details()}")
        if stopping.is_set() and sum(1 for a in answers if a != "live") >= 3:
            answers_while_stopping.set()
        return h.server.dispatcher.sessions.find(sid) is None  # the sandbox stopped: it has ended

    await until(poll, "the session to expire", timeout=10, interval=0.02)
    await poll()
    assert answers[0] == "live" and stopping.is_set()
    ended = [a for a in answers if a != "live"]
    assert len(ended) >= 4 and "live" not in answers[answers.index(ended[0]) :]
    for answer in ended:
        assert answer.startswith("NOT_FOUND: session 'ses_") and "expired at" in answer, answers
        assert answer.endswith("(idle)"), answers


async def test_a_session_being_closed_is_closed_to_its_tenant_and_unknown_to_others(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = harness.client()
    sid = (await _create(client)).session_id
    provider = harness.server.provider
    stop = provider.close_session
    stopping, release = asyncio.Event(), asyncio.Event()

    async def slow_stop(session_id: str) -> None:
        stopping.set()
        await release.wait()
        await stop(session_id)

    monkeypatch.setattr(provider, "close_session", slow_stop)
    closing = asyncio.create_task(_rpc(client, "CloseSession", pb.CloseSessionRequest(session_id=sid)))
    await asyncio.wait_for(stopping.wait(), 10)
    get = pb.GetSessionRequest(session_id=sid)
    seen = [await _code(_rpc(client, "GetSession", get))]  # its sandbox still stopping
    release.set()
    await closing
    seen.append(await _code(_rpc(client, "GetSession", get)))
    assert seen == [(grpc.StatusCode.NOT_FOUND, f"session {sid!r} is closed")] * 2
    code, details = await _code(_rpc(harness.client(TOKEN_BETA), "GetSession", get))
    assert (code, details) == (grpc.StatusCode.NOT_FOUND, f"no session {sid!r}")
