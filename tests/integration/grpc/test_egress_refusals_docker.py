"""Issue 20's refusals in real sandboxes (marker ``docker``), under runc and runsc: a port not listed,
``max_connections`` and ``max_bytes``, each seen by Python's own HTTP client in the sandbox (the
403 text it prints), in the audit log and in the metrics.

The origin is a server on the host's loopback. The sandbox (network ``none``) reaches it only
through its proxy listener, the agent channel and the server's proxy, which runs on the host and
so connects to the host's loopback; the tests' config takes 127.0.0.0/8 out of ``deny_networks``
for that. Nothing else is reached, and the port that is not listed belongs to a listener here that
must never see a connection.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS
from tests.integration.grpc.conftest import Start
from tests.server.conftest import TOKEN_ALPHA, Harness
from tests.server.helpers import text_of, until

pytestmark = pytest.mark.docker

LOOPBACK_OPEN = [n for n in DEFAULT_DENY_NETWORKS if n != "127.0.0.0/8"]
MAX_BYTES = 100_000
BIG = 4 * MAX_BYTES
"""The body of ``GET /big``: more than the session may relay."""
CLIENT = """\
import http.client, os, sys, urllib.error, urllib.request
# The origin is the host's loopback, reached through the proxy only: 127.0.0.1 must not bypass it.
for name in ("NO_PROXY", "no_proxy"):
    os.environ.pop(name, None)
proxy = urllib.request.getproxies()["http"].split("//")[1].split(":")

def get(url):
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            print("got", response.status, len(response.read()))
    except urllib.error.HTTPError as exc:
        print("refused", exc.code, exc.reason)
    except Exception as exc:
        print("failed", type(exc).__name__)

def tunnel(port):
    conn = http.client.HTTPConnection(proxy[0], int(proxy[1]), timeout=60)
    conn.set_tunnel("127.0.0.1", int(port))
    conn.connect()  # CONNECT; a refusal raises OSError("Tunnel connection failed: 403 ...")
    return conn

if sys.argv[1] == "get":
    get(sys.argv[2])
else:  # two tunnels at once
    first = tunnel(sys.argv[2])
    first.sock.sendall(b"ping")
    print("first echoed", first.sock.recv(100).decode())
    try:
        tunnel(sys.argv[2])
        print("second established")
    except OSError as exc:
        print("second", exc)
"""


class Origin:
    """Answers ``GET /big`` with ``BIG`` bytes, anything else with ``ok``; echoes a tunnel's bytes."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.read(65536)
            if first.startswith(b"GET "):
                body = b"x" * BIG if first.startswith(b"GET /big ") else b"ok"
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                )
                writer.write(body)
            else:
                while first:
                    writer.write(first)
                    await writer.drain()
                    first = await reader.read(65536)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def origin() -> AsyncIterator[Origin]:
    served = Origin()
    served.server = await asyncio.start_server(served.handle, "127.0.0.1", 0)
    yield served
    served.server.close()


def _audit(h: Harness, sid: str) -> list[dict[str, Any]]:
    path = h.tmp / "home" / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [
        r for r in map(json.loads, lines) if r.get("kind") == "egress.connection" and r["session_id"] == sid
    ]


def _refused_total(h: Harness) -> float:
    port = h.server.observability.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    line = 'dispatcher_egress_connections_total{decision="refused",tenant="alpha"} '
    found = [float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)]
    return found[0] if found else 0.0


async def _session(h: Harness) -> tuple[Any, str]:
    client = h.client(TOKEN_ALPHA)
    sid = (await client.create_session()).session_id
    (h.tmp / "ws-alpha" / "default" / "egress_client.py").write_text(CLIENT)  # the tenant's workspace
    return client, sid


async def _run(client: Any, sid: str, args: str) -> str:
    result = await client.call(sid, "shell", {"command": f"python3 egress_client.py {args}"})
    return text_of(result)


async def test_ports_and_quotas_are_refused_with_the_403_text_audited_and_counted(
    start: Start, runtime: str, origin: Origin
) -> None:
    egress = {
        "allow": ["127.0.0.1"],
        "ports": [origin.port],
        "deny_networks": LOOPBACK_OPEN,
        "max_connections": 1,
        "max_bytes": MAX_BYTES,
    }
    h = await start(sandbox={"runtime": runtime}, metrics={"listen": "127.0.0.1:0"}, egress=egress)

    # A port not listed: refused before anything connects to it.
    unlisted = socket.create_server(("127.0.0.1", 0))
    unlisted.setblocking(False)
    try:
        port = unlisted.getsockname()[1]
        client, sid = await _session(h)
        out = await _run(client, sid, f"get http://127.0.0.1:{port}/x")
        assert (
            f"refused 403 egress refused: 127.0.0.1:{port}: port {port} is not allowed "
            f"(allowed ports: {origin.port})" in out
        ), out
        with pytest.raises(BlockingIOError):
            unlisted.accept()  # nobody ever connected
    finally:
        unlisted.close()
    await until(lambda: len(_audit(h, sid)) == 1, "the port refusal's audit record")
    (record,) = _audit(h, sid)
    assert (record["decision"], record["reason"], record["port"]) == ("refused", "port_not_allowed", port)
    assert record["address"] is None and record["bytes_in"] == record["bytes_out"] == 0
    assert _refused_total(h) == 1

    # max_connections: 1. The second tunnel opened while the first is held is refused.
    client, sid = await _session(h)
    out = await _run(client, sid, f"two {origin.port}")
    assert "first echoed ping" in out, out
    assert (
        "second Tunnel connection failed: 403 egress refused: "
        f"127.0.0.1:{origin.port}: the session's quota is reached: 1 connections are open (max_connections)"
    ) in out, out
    await until(lambda: len(_audit(h, sid)) == 2, "both tunnels' audit records")
    records = {r["reason"]: r for r in _audit(h, sid)}
    assert set(records) == {"listed", "connections_quota"}, records
    assert records["listed"]["decision"] == "allowed" and records["listed"]["bytes_out"] == 4
    assert records["connections_quota"]["decision"] == "refused"
    assert _refused_total(h) == 2

    # max_bytes: a download past the session's bytes is cut; the next connection is refused.
    client, sid = await _session(h)
    out = await _run(client, sid, f"get http://127.0.0.1:{origin.port}/big")
    assert "failed IncompleteRead" in out, out
    out = await _run(client, sid, f"get http://127.0.0.1:{origin.port}/small")
    assert (
        f"refused 403 egress refused: 127.0.0.1:{origin.port}: the session's quota is reached: "
        f"{MAX_BYTES} bytes relayed (max_bytes)"
    ) in out, out
    await until(lambda: len(_audit(h, sid)) == 2, "the bytes quota's audit records")
    cut, refused = _audit(h, sid)
    assert (cut["decision"], cut["end"]) == ("allowed", "bytes_quota")
    assert cut["bytes_in"] + cut["bytes_out"] <= MAX_BYTES
    assert (refused["decision"], refused["reason"]) == ("refused", "bytes_quota")
    assert _refused_total(h) == 3
