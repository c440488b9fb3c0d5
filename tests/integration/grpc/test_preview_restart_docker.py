"""Preview ports through a ``kill -9`` of a real ``dispatcher serve`` on Docker (marker ``docker``):
the same URL with the same token answers the same body from the dev server still running in the
re-adopted container; a port closed before the kill stays closed; a wrong token is still refused.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dispatcher.client import DispatcherClient, OpenedPort
from dispatcher.server.preview.gateway import HEADER
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import unmount_under
from tests.polling import until_sync
from tests.server.helpers import text_of
from tests.server.persistence.test_restart import kill9
from tests.server.serve_process import ServeProcess, start_serve

pytestmark = pytest.mark.docker

BODY = "served from the sandbox\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def serve(tmp_path: Path, make_provider: ProviderFactory) -> Iterator[Callable[[], ServeProcess]]:
    """Start ``dispatcher serve`` on Docker with a preview gateway: the same home, instance label
    and gateway port each time (the URLs handed out name that port)."""
    instance = make_provider.new_instance()  # its containers swept by the factory whatever happens
    gateway = _free_port()
    started: list[ServeProcess] = []

    def go() -> ServeProcess:
        data = {
            "sandbox": {"backend": "docker", "instance": instance},
            "preview": {"listen": f"127.0.0.1:{gateway}", "domain": "localhost"},
            "server": {"grace_seconds": 2},
            "log": {"format": "json", "level": "info"},
            "tool_confirmation": {"default": {"EXECUTE": "auto"}},
        }
        server = start_serve(tmp_path, data=data)
        started.append(server)
        return server

    try:
        yield go
    finally:
        for server in started:
            server.close()
        unmount_under(tmp_path)


def _get(url: str, token: str, path: str = "hello.txt") -> tuple[int, bytes]:
    """GET ``path`` under a preview URL, on loopback, with the token in its header."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection("127.0.0.1", parts.port, timeout=30)
    try:
        conn.request("GET", f"/{path}", headers={"Host": parts.netloc, HEADER: token})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _listening(opened: OpenedPort) -> bool:
    return _get(opened.url, opened.token)[0] == 200


def _serve_in_sandbox(client: DispatcherClient, session_id: str, port: int) -> None:
    result = client.call(
        session_id,
        "shell",
        {"command": f"python3 -m http.server {port} --bind 127.0.0.1", "background": True},
    )
    assert not result.is_error, text_of(result)


def test_a_preview_url_and_its_token_work_after_kill_9_and_a_closed_port_stays_closed(
    serve: Callable[[], ServeProcess],
) -> None:
    server = serve()
    with server.client() as client:
        info = client.create_session("proj")
        sid = info.session_id
        (Path(info.workspace_path) / "hello.txt").write_text(BODY)
        _serve_in_sandbox(client, sid, 8000)
        _serve_in_sandbox(client, sid, 8001)
        kept = client.open_port(sid, 8000, expires_in_seconds=3600)
        closed = client.open_port(sid, 8001)
        for opened in (kept, closed):
            until_sync(partial(_listening, opened), "the dev server to listen", timeout=30)
        assert _get(kept.url, kept.token) == (200, BODY.encode())
        client.close_port(sid, 8001)
        assert _get(closed.url, closed.token)[0] == 404
    # ClosePort and OpenPort answered once committed: no wait for the writer before the kill.
    kill9(server)

    server = serve()
    assert _get(kept.url, kept.token) == (200, BODY.encode()), "".join(server.stderr)[-4000:]
    assert _get(kept.url, kept.token + "x")[0] == 401
    assert _get(closed.url, closed.token)[0] == 404
    with server.client() as client:
        ports = client.get_session(sid).open_ports
        assert [(p.port, p.url) for p in ports] == [(8000, kept.url)]
        reopened = client.open_port(sid, 8000)  # a new token replaces the kept one, as before
    assert _get(kept.url, reopened.token) == (200, BODY.encode())
    assert _get(kept.url, kept.token)[0] == 401
