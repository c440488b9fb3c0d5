"""Open preview ports across restarts of a real ``dispatcher serve`` on the local backend: kept
with their session through ``kill -9``, and dropped (rows deleted, a log line) when the server
comes back without a preview gateway. The Docker side (the same URL and token answering through
the re-adopted container) is in ``tests/integration/grpc/test_preview_restart_docker.py``."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

from tests.server.persistence.test_restart import kill9, local_config, sigterm
from tests.server.serve_process import start_serve


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stored(home: Path) -> list[tuple[str, int]]:
    conn = sqlite3.connect(home / "state.db")
    try:
        return conn.execute("SELECT session_id, port FROM preview_ports ORDER BY port").fetchall()
    finally:
        conn.close()


def test_ports_are_kept_through_kill_9_and_dropped_without_a_gateway(tmp_path: Path) -> None:
    preview = {"preview": {"listen": f"127.0.0.1:{_free_port()}", "domain": "localhost"}}
    server = start_serve(tmp_path, data=local_config(**preview))
    try:
        with server.client() as client:
            sid = client.create_session("proj").session_id
            first = client.open_port(sid, 8000)
            client.open_port(sid, 8001)
        assert _stored(server.home) == [(sid, 8000), (sid, 8001)]  # committed before OpenPort answered
    finally:
        kill9(server)

    server = start_serve(tmp_path, data=local_config(**preview))
    try:
        with server.client() as client:
            assert [(p.port, p.url) for p in client.get_session(sid).open_ports] == [
                (8000, first.url),
                (8001, first.url.replace("8000-", "8001-")),
            ]
    finally:
        sigterm(server)

    server = start_serve(tmp_path, data=local_config())  # no preview gateway now
    try:
        assert _stored(server.home) == []
        assert any("stored preview ports dropped" in line for line in server.stderr)
        with server.client() as client:
            assert client.get_session(sid).open_ports == ()
    finally:
        sigterm(server)
