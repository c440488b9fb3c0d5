"""Session clocks across a kill -9 of a real ``dispatcher serve`` (local backend): the paused stay
paused, a renewed expiry is kept, the overdue expire at once after the start."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.config import hash_token
from dispatcher.core.sessions.clock import MAX_CLOCK_SECONDS
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.polling import until_sync
from tests.server.persistence.test_restart import kill9, local_config, wait_stored
from tests.server.serve_process import start_serve


def _rpc(client: DispatcherClient, name: str, request: Any) -> Any:
    return client._unary(getattr(client._stub, name), request)


def _stored(home: Path, session_id: str, fragment: str) -> None:
    query = "SELECT lifecycle FROM sessions WHERE session_id = ?"
    wait_stored(home, query, (session_id,), lambda row: row is not None and fragment in row[0])


def test_paused_stay_paused_renewed_keep_their_expiry_and_overdue_expire_at_once(tmp_path: Path) -> None:
    data = local_config(sessions={"idle_timeout_seconds": 3600, "expiring_notice_seconds": 0})
    server = start_serve(tmp_path, data=data)
    try:
        with server.client() as client:
            paused = _rpc(client, "CreateSession", pb.CreateSessionRequest()).session.session_id
            _rpc(client, "PauseSession", pb.PauseSessionRequest(session_id=paused))
            renewed = client.create_session(ttl_seconds=60).session_id
            request = pb.RenewSessionRequest(session_id=renewed, ttl_seconds=5000)
            expiry = _rpc(client, "RenewSession", request).session.expire_time.seconds
            overdue_info = client.create_session(ttl_seconds=2)
            overdue = overdue_info.session_id
            assert overdue_info.expire_time is not None
            overdue_at = overdue_info.expire_time + 1
        _stored(server.home, paused, '"paused": "request"')
        _stored(server.home, renewed, f'"expire_time": {expiry}')
    finally:
        kill9(server)
    until_sync(lambda: time.time() > overdue_at, "the overdue session's TTL to pass", timeout=10)
    server = start_serve(tmp_path, data=data)
    try:
        with server.client() as client:
            state = _rpc(client, "GetSession", pb.GetSessionRequest(session_id=paused)).session.state
            assert state == pb.SESSION_STATE_PAUSED
            got = _rpc(client, "GetSession", pb.GetSessionRequest(session_id=renewed)).session
            assert got.expire_time.seconds == expiry and got.state == pb.SESSION_STATE_ACTIVE

            def gone() -> bool:
                try:
                    _rpc(client, "GetSession", pb.GetSessionRequest(session_id=overdue))
                except RequestFailed as exc:
                    assert exc.code == "NOT_FOUND" and "(ttl)" in exc.details, exc
                    return True
                return False

            until_sync(gone, "the overdue session to expire", timeout=10)
            result = client.call(paused, "shell", {"command": "echo back"})
            assert "resumed" in str(result.content) and "back" in str(result.content)
    finally:
        server.close()


def test_a_session_stored_before_sessions_had_clocks_gets_the_default_ones_at_restart(tmp_path: Path) -> None:
    data = local_config(sessions={"ttl_seconds": 7200, "idle_timeout_seconds": 600})
    server = start_serve(tmp_path, data=data)
    try:
        with server.client() as client:
            sid = _rpc(client, "CreateSession", pb.CreateSessionRequest()).session.session_id
        _stored(server.home, sid, '"expire_time"')
    finally:
        kill9(server)
    # As the migration to session clocks leaves a row written before them: an empty lifecycle.
    conn = sqlite3.connect(server.home / "state.db")
    with conn:
        conn.execute("UPDATE sessions SET lifecycle = '{}' WHERE session_id = ?", (sid,))
    conn.close()
    before = time.time()
    server = start_serve(tmp_path, data=data)
    try:
        with server.client() as client:
            got = _rpc(client, "GetSession", pb.GetSessionRequest(session_id=sid)).session
        # Its clocks start at the restart, under the server's defaults, and are stored.
        assert before + 7200 - 5 <= got.expire_time.seconds <= time.time() + 7200 + 1, got
        assert before + 600 - 5 <= got.idle_expire_time.seconds <= time.time() + 600 + 1, got
        _stored(server.home, sid, '"expire_time"')
    finally:
        server.close()


def test_a_session_stored_with_clocks_past_the_bound_is_given_back_within_it(tmp_path: Path) -> None:
    data = local_config()
    server = start_serve(tmp_path, data=data)
    try:
        with server.client() as client:
            sid = _rpc(client, "CreateSession", pb.CreateSessionRequest()).session.session_id
        _stored(server.home, sid, '"expire_time"')
    finally:
        kill9(server)
    # As an older server, which took any number, left it: clocks no Timestamp can hold.
    conn = sqlite3.connect(server.home / "state.db")
    with conn:
        huge = json.dumps(
            {
                "ttl_seconds": 1e13,
                "idle_timeout_seconds": 9e18,
                "expire_time": 1e13,
                "last_activity": time.time(),
            }
        )
        conn.execute("UPDATE sessions SET lifecycle = ? WHERE session_id = ?", (huge, sid))
    conn.close()
    server = start_serve(tmp_path, data=data)
    try:
        with server.client() as client:
            listed = _rpc(client, "ListSessions", pb.ListSessionsRequest()).sessions
            assert [s.session_id for s in listed] == [sid]
            bound = time.time() + MAX_CLOCK_SECONDS + 5
            assert listed[0].expire_time.seconds <= bound and listed[0].idle_expire_time.seconds <= bound
            result = client.call(sid, "shell", {"command": "echo still here"})
            assert "still here" in str(result.content)
    finally:
        server.close()


def test_a_restored_session_lives_under_its_tenant_maximum_as_configured_now(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "token").write_text("restart-token\n")

    def config(maximum: float) -> dict[str, Any]:
        tenant = {
            "id": "default",
            "token_sha256": [hash_token("restart-token")],
            "workspace_root": str(home / "workspaces"),
            "max_session_ttl_seconds": maximum,
        }
        return local_config(sessions={"expiring_notice_seconds": 0}, tenants=[tenant])

    server = start_serve(tmp_path, data=config(600))
    try:
        with server.client() as client:
            request = pb.CreateSessionRequest(ttl_seconds=600, on_expire=pb.ON_EXPIRE_PAUSE)
            sid = _rpc(client, "CreateSession", request).session.session_id
        _stored(server.home, sid, '"end_time"')
    finally:
        kill9(server)
    server = start_serve(tmp_path, data=config(2))  # the operator lowered the maximum
    try:
        with server.client() as client:

            def closed() -> bool:
                try:
                    _rpc(client, "GetSession", pb.GetSessionRequest(session_id=sid))
                except RequestFailed as exc:
                    assert exc.code == "NOT_FOUND", exc
                    return "(ttl)" in exc.details
                return False

            # Two seconds from its creation, paused or not: it closes, it does not pause.
            until_sync(closed, "the session to close at its tenant's new maximum", timeout=10)
    finally:
        server.close()
