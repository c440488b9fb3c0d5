"""Issue 37 item 8 in real sandboxes (marker ``docker``), under runc and runsc: a session narrowed
by ``egress_allow`` reaches its own host only, under ``unknown: prompt``, while the network class
runs unasked (an autonomous session, and a cautious one under the tenant's ``NETWORK: auto``).

The destinations are three origins on the host's loopback, named by IP literal so that no name is
ever resolved: ``127.0.0.1`` (the session's list), ``127.0.0.2`` (only the tenant's) and
``127.0.0.3`` (no list). The sandbox (network ``none``) reaches them only through its proxy
listener, the agent channel and the server's proxy; the tests' config takes 127.0.0.0/8 out of
``deny_networks`` so that only the session's narrowing stands between the sandbox and the two
others. Nothing but loopback is ever contacted, whatever the code under test does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS
from tests.integration.grpc.conftest import Start
from tests.server.conftest import TOKEN_ALPHA, Harness, base_config
from tests.server.helpers import text_of, until

pytestmark = pytest.mark.docker

LOOPBACK_OPEN = [n for n in DEFAULT_DENY_NETWORKS if n != "127.0.0.0/8"]
SESSION, TENANT, UNLISTED = "127.0.0.1", "127.0.0.2", "127.0.0.3"
CLIENT = """\
import os, sys, urllib.error, urllib.request
for name in ("NO_PROXY", "no_proxy"):  # loopback must go through the proxy too
    os.environ.pop(name, None)
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            print(url, "got", response.status, response.read().decode())
    except urllib.error.HTTPError as exc:
        print(url, "refused", exc.code, exc.reason)
    except Exception as exc:
        print(url, "failed", type(exc).__name__)
"""


class Origin:
    """Answers any request with ``ok``; counts the connections it accepted."""

    def __init__(self) -> None:
        self.accepted = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def origins() -> AsyncIterator[dict[str, Origin]]:
    made = {host: Origin() for host in (SESSION, TENANT, UNLISTED)}
    for host, origin in made.items():
        origin.server = await asyncio.start_server(origin.handle, host, 0)
    yield made
    for origin in made.values():
        assert origin.server is not None
        origin.server.close()


def _audit(h: Harness, sid: str) -> list[dict[str, Any]]:
    path = h.tmp / "home" / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [
        r for r in map(json.loads, lines) if r.get("kind") == "egress.connection" and r["session_id"] == sid
    ]


@pytest.mark.parametrize("mode", ["autonomous", "cautious"])
async def test_a_narrowed_session_reaches_only_its_own_host_when_network_runs_unasked(
    start: Start, runtime: str, origins: dict[str, Origin], tmp_path: Path, mode: str
) -> None:
    tenants = base_config(tmp_path)["tenants"]
    alpha = next(t for t in tenants if t["id"] == "alpha")
    alpha["tool_confirmation"] = {"default": {"EXECUTE": "auto", "NETWORK": "auto"}}
    egress = {
        "allow": [SESSION, TENANT],
        "unknown": "prompt",
        "ports": sorted(o.port for o in origins.values()),
        "deny_networks": LOOPBACK_OPEN,
    }
    h = await start(sandbox={"runtime": runtime}, egress=egress, tenants=tenants)
    client = h.client(TOKEN_ALPHA)
    session = await client.create_session(mode=mode, egress_allow=[SESSION])
    sid = session.session_id
    assert session.capabilities.egress_allow == (SESSION,)
    (tmp_path / "ws-alpha" / "default" / "narrow_client.py").write_text(CLIENT)
    urls = {host: f"http://{host}:{origin.port}/x" for host, origin in origins.items()}

    result = await client.call(
        sid, "shell", {"command": "python3 narrow_client.py " + " ".join(urls.values())}
    )
    out = text_of(result)
    assert f"{urls[SESSION]} got 200 ok" in out, out
    for host in (TENANT, UNLISTED):
        assert (
            f"{urls[host]} refused 403 egress refused: {host}:{origins[host].port}: "
            f"{host} is not on this session's egress allow list (allowed: {SESSION})"
        ) in out, out
    assert (origins[SESSION].accepted, origins[TENANT].accepted, origins[UNLISTED].accepted) == (1, 0, 0)
    await until(lambda: len(_audit(h, sid)) == 3, "three audit records")
    reasons = {r["host"]: (r["decision"], r["reason"]) for r in _audit(h, sid)}
    assert reasons == {
        SESSION: ("allowed", "listed"),
        TENANT: ("refused", "not_listed"),
        UNLISTED: ("refused", "not_listed"),
    }
