"""Contract: the docker SDK internals ``DockerAPI._exec_attach_sync`` relies on are still there.

``_exec_attach_sync`` sends ``POST /exec/{id}/start`` with ``Upgrade: tcp`` itself (through
``APIClient._url``, ``_post_json`` and ``_raise_for_status``) and takes the socket out of the
response (``res.raw._fp.fp.raw._sock``), keeping the stream bytes that http.client buffered past
the 101 headers. None of that is public API, hence the ``docker>=7,<8`` pin in pyproject.toml.
These tests run the real SDK against a loopback stand-in for the daemon (TCP and a unix socket),
so a docker release that changes any of it fails here, saying what to change, instead of in
production.
"""

from __future__ import annotations

import inspect
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.host import ContainerNotFound
from dispatcher.sandbox.docker.client import DockerAPI

WHAT_TO_CHANGE = (
    "the docker SDK changed an internal that DockerAPI._exec_attach_sync"
    " (dispatcher/sandbox/docker/client.py) uses; adapt that method to the new SDK (or keep the"
    " `docker>=7,<8` pin in pyproject.toml)"
)
API_VERSION = "1.44"
STREAM = b"\x01\x00\x00\x00\x00\x00\x00\x05hello"  # one stdout frame, sent with the 101 headers

EXPECTED_SIGNATURES = {
    "_url": ["self", "pathfmt", "*args", "**kwargs"],
    "_post_json": ["self", "url", "data", "**kwargs"],
    "_raise_for_status": ["self", "response"],
}


def _shape(fn: object) -> list[str]:
    shape = []
    for p in inspect.signature(fn).parameters.values():  # type: ignore[arg-type]
        prefix = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        shape.append(prefix + p.name)
    return shape


@pytest.mark.parametrize("name", sorted(EXPECTED_SIGNATURES))
def test_the_sdk_internals_keep_their_shape(name: str) -> None:
    fn = getattr(docker.APIClient, name, None)
    assert fn is not None, f"docker.APIClient.{name} is gone: {WHAT_TO_CHANGE}"
    assert _shape(fn) == EXPECTED_SIGNATURES[name], (
        f"docker.APIClient.{name} now takes {_shape(fn)}: {WHAT_TO_CHANGE}"
    )


class FakeDaemon:
    """Answers one exec start: 101 plus the first stream bytes in one write, then echoes stdin."""

    def __init__(self, listener: socket.socket, status: str = "101 UPGRADED") -> None:
        self.listener = listener
        self.status = status
        self.request = b""
        self.received = b""
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while b"\r\n\r\n" not in self.request:
                self.request += conn.recv(65536)
            head, _, body = self.request.partition(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            while len(body) < length:
                body += conn.recv(65536)
            self.request = head + b"\r\n\r\n" + body
            if not self.status.startswith("101"):
                message = b'{"message": "No such exec instance: abc"}'
                conn.sendall(
                    f"HTTP/1.1 {self.status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(message)}\r\n\r\n".encode()
                    + message
                )
                return
            conn.sendall(
                b"HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
                b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n" + STREAM
            )
            while chunk := conn.recv(65536):
                self.received += chunk
                conn.sendall(chunk)

    def body(self) -> dict[str, object]:
        result: dict[str, object] = json.loads(self.request.partition(b"\r\n\r\n")[2])
        return result


@pytest.fixture(params=["tcp", "unix"])
def endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    if request.param == "tcp":
        listener = socket.create_server(("127.0.0.1", 0))
        url = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    else:
        path = str(tmp_path / "docker.sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen()
        url = f"unix://{path}"
    with listener:
        yield listener, url


def _read_exactly(sock: socket.socket, n: int, already: bytes = b"") -> bytes:
    data = already
    sock.settimeout(10)
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the upgraded connection closed early"
        data += chunk
    return data


def test_exec_attach_keeps_the_upgraded_socket_and_the_bytes_read_with_the_headers(
    endpoint: tuple[socket.socket, str],
) -> None:
    listener, url = endpoint
    daemon = FakeDaemon(listener)
    client = docker.APIClient(base_url=url, version=API_VERSION)
    try:
        sock, leftover = DockerAPI(client=client)._exec_attach_sync("abc")
    except (AttributeError, TypeError) as exc:
        pytest.fail(f"{WHAT_TO_CHANGE}: {exc!r}")
    with sock:
        assert isinstance(sock, socket.socket), WHAT_TO_CHANGE
        # Whatever http.client buffered past the headers must come back, or the agent's first
        # frame is lost; the rest is on the socket.
        assert STREAM.startswith(leftover), WHAT_TO_CHANGE
        assert _read_exactly(sock, len(STREAM), leftover) == STREAM
        sock.sendall(b"stdin bytes")
        assert _read_exactly(sock, len(b"stdin bytes")) == b"stdin bytes"
    client.close()
    daemon.thread.join(10)
    head = daemon.request.partition(b"\r\n\r\n")[0].decode()
    assert head.startswith(f"POST /v{API_VERSION}/exec/abc/start HTTP/1.1"), head
    assert "Upgrade: tcp" in head and "Connection: Upgrade" in head
    assert daemon.body() == {"Tty": False, "Detach": False}


async def test_an_error_status_becomes_a_sandbox_error(endpoint: tuple[socket.socket, str]) -> None:
    listener, url = endpoint
    FakeDaemon(listener, status="404 Not Found")
    api = DockerAPI(client=docker.APIClient(base_url=url, version=API_VERSION))
    try:
        with pytest.raises(ContainerNotFound, match="No such exec instance"):
            await api.exec_attach("abc")
    finally:
        await api.aclose()
    assert issubclass(ContainerNotFound, SandboxError)
