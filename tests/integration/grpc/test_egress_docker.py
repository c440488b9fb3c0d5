"""Issue 20 in real sandboxes (marker ``docker``), under runc and runsc: ``pip download`` of a small
pure-Python package from the index pip uses, through the agent's proxy listener and the server's
egress proxy, with no host step; an unlisted host refused in under a second with the 403 text; an
unlisted host asked about and answered from a second client; the audit records and metrics.

The index and the host serving its files are read at run time: the index from pip's own
configuration in the sandbox image (``pip config``, else pip's default), the files host from the
index's answer. Nothing else is reached: the sandbox's network is ``none``, the proxy refuses every
other host, and the tests' only other destination is loopback. This machine sits behind an
intercepting proxy (its CA is in the system bundle, mounted as ``ca_bundle``); the registry's
addresses it resolves to are printed and must lie outside the default ``deny_networks``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import docker
import pytest

from dispatcher.core.dispatcher import Decision
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, denied_by, parse_networks
from dispatcher.sandbox.container.config import DEFAULT_IMAGE
from tests.events import ToolConfirmationRequested
from tests.integration.grpc.conftest import Start
from tests.server.conftest import TOKEN_ALPHA, Harness
from tests.server.helpers import next_event, text_of, until

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("DISPATCHER_EGRESS_TEST_IMAGE", DEFAULT_IMAGE)
"""The default image (another tag only to try a new agent before the shared image is rebuilt)."""
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"
PACKAGE = "six"
"""Small, pure Python, one file, no dependencies."""
_PIP_INDEX = (
    "import subprocess, sys\n"
    "out = subprocess.run([sys.executable, '-m', 'pip', 'config', 'get', 'global.index-url'],"
    " capture_output=True, text=True).stdout.strip()\n"
    "from pip._internal.models.index import PyPI\n"
    "print(out or PyPI.simple_url)\n"
)
_FILES_HOST = """\
import re, sys, urllib.request
page = urllib.request.urlopen(sys.argv[1].rstrip("/") + "/" + sys.argv[2] + "/", timeout=60).read()
print(re.search(rb'href="(https?://[^"/]+)', page).group(1).decode().split("//")[1])
"""


@pytest.fixture(scope="module")
def index_url(docker_client: docker.DockerClient) -> str:
    """pip's effective index in the sandbox image, read in a container without network."""
    out = docker_client.containers.run(
        IMAGE, ["python3", "-c", _PIP_INDEX], network_mode="none", remove=True, user="1000:1000"
    )
    url: str = out.decode().strip().splitlines()[-1]
    assert url.startswith("https://"), url
    return url


def _config(runtime: str, allow: list[str], **egress: Any) -> dict[str, Any]:
    return {
        "sandbox": {"runtime": runtime, "image": IMAGE, "pids_limit": 256},
        "metrics": {"listen": "127.0.0.1:0"},
        "egress": {"allow": allow, "ca_bundle": SYSTEM_CA, **egress},
    }


def _audit(h: Harness) -> list[dict[str, Any]]:
    path = h.tmp / "home" / "audit.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if r.get("kind") == "egress.connection"]


def _metrics(h: Harness) -> str:
    port = h.server.observability.metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _check_addresses(*hosts: str) -> None:
    """Print what the registry's names resolve to here; they must pass the default deny list."""
    deny = parse_networks(DEFAULT_DENY_NETWORKS)
    for host in hosts:
        addresses = sorted({info[4][0] for info in socket.getaddrinfo(host, 443, type=socket.SOCK_STREAM)})
        print(f"{host} resolves to {addresses}")
        for address in addresses:
            assert denied_by(ipaddress.ip_address(address), deny) is None, (host, address)


async def _shell(client: Any, sid: str, command: str, **kw: Any) -> str:
    result = await client.call(sid, "shell", {"command": command}, **kw)
    return text_of(result)


async def test_pip_downloads_a_package_from_the_index_through_the_proxy(
    start: Start, runtime: str, index_url: str
) -> None:
    index_host = urlsplit(index_url).hostname or ""
    h = await start(**_config(runtime, [index_host]))
    client = h.client(TOKEN_ALPHA)
    sid = (await client.create_session()).session_id
    # Only the index is allowed: its answer names the host that serves the files.
    (h.tmp / "ws-alpha" / "default" / "files_host.py").write_text(_FILES_HOST)
    files_host = (await _shell(client, sid, f"python3 files_host.py {index_url} {PACKAGE}")).strip()
    files_host = files_host.splitlines()[-1]
    assert "." in files_host and " " not in files_host, files_host
    _check_addresses(index_host, files_host)
    await h.server.stop(grace=1)  # the next server takes the same home
    h2 = await start(**_config(runtime, [index_host, files_host]))
    client2 = h2.client(TOKEN_ALPHA)
    sid2 = (await client2.create_session()).session_id
    env = await _shell(
        client2, sid2, "env | grep -E '^(HTTPS_PROXY|NO_PROXY|SSL_CERT_FILE|PIP_CERT)=' | sort"
    )
    assert "HTTPS_PROXY=http://127.0.0.1:3128" in env and "NO_PROXY=localhost,127.0.0.1" in env
    assert "SSL_CERT_FILE=/opt/dispatcher/ca-bundle.crt" in env
    out = await _shell(
        client2, sid2, f"python3 -m pip download --no-deps -d dl {PACKAGE} 2>&1; ls dl", tool_use_id="tu_pip"
    )
    assert "Successfully downloaded" in out and ".whl" in out, out
    assert list((h2.tmp / "ws-alpha" / "default" / "dl").glob(f"{PACKAGE}-*.whl"))
    records = [r for r in _audit(h2) if r["session_id"] == sid2]
    print(records)
    assert {r["host"] for r in records} == {index_host, files_host}
    assert all(r["decision"] == "allowed" and r["tool_use_id"] == "tu_pip" for r in records), records
    assert 'dispatcher_egress_connections_total{decision="allowed",tenant="alpha"}' in _metrics(h2)


async def test_by_default_pip_fails_in_under_a_second_with_the_403_text(start: Start, runtime: str) -> None:
    h = await start(sandbox={"runtime": runtime, "image": IMAGE}, metrics={"listen": "127.0.0.1:0"})
    client = h.client(TOKEN_ALPHA)
    sid = (await client.create_session()).session_id
    await _shell(client, sid, "true")  # the sandbox is up: what follows times pip alone
    timed = "t0=$(date +%s%N); {} 2>&1; t1=$(date +%s%N); echo elapsed_ms $(( (t1 - t0) / 1000000 ))"
    started = time.monotonic()
    out = await _shell(client, sid, timed.format(f"python3 -m pip download --no-deps -d dl {PACKAGE}"))
    took = time.monotonic() - started
    # pip's own start (imports) is no part of the refusal; under gVisor it is most of a second
    start_only = await _shell(client, sid, timed.format("python3 -m pip --version"))
    pip_ms = int(out.split("elapsed_ms ")[1].split()[0])
    start_ms = int(start_only.split("elapsed_ms ")[1].split()[0])
    print(out, f"the call took {took:.2f} s; pip {pip_ms} ms, of which starting pip {start_ms} ms")
    assert "403 egress refused:" in out and "no host is allowed: this sandbox has no network access" in out
    assert "No matching distribution" in out
    assert pip_ms - start_ms < 1000 and (runtime == "runsc" or pip_ms < 1000)
    records = _audit(h)
    assert records and all(r["decision"] == "refused" and r["reason"] == "not_listed" for r in records)
    assert all(r["address"] is None for r in records)  # refused before any name was resolved
    assert 'dispatcher_egress_connections_total{decision="refused",tenant="alpha"}' in _metrics(h)


async def test_an_unlisted_host_is_asked_about_from_a_second_client(
    start: Start, runtime: str, index_url: str
) -> None:
    index_host = urlsplit(index_url).hostname or ""
    h = await start(**_config(runtime, [], unknown="prompt"))
    agent, human = h.client(TOKEN_ALPHA), h.client(TOKEN_ALPHA)
    sid = (await agent.create_session()).session_id
    page = f"{index_url.rstrip('/')}/{PACKAGE}/"
    fetch = (
        f"python3 -c \"import urllib.request; print(urllib.request.urlopen('{page}', timeout=60).status)\""
    )
    call = asyncio.create_task(_shell(agent, sid, fetch, tool_use_id="tu_fetch"))
    request = await next_event(human, sid, ToolConfirmationRequested, timeout=120)
    assert request.tool_use_id == "tu_fetch"
    assert (request.payload.tool_name, request.payload.input_summary) == (
        "egress",
        f"connect {index_host}:443",
    )
    await human.resolve_confirmation(sid, str(request.payload.request_id), Decision.ALLOW)
    out = await asyncio.wait_for(call, 120)
    assert out.strip().endswith("200"), out
    denied = asyncio.create_task(_shell(agent, sid, fetch + " 2>&1 | tail -1"))
    request = await next_event(human, sid, ToolConfirmationRequested, after_seq=request.seq, timeout=60)
    await human.resolve_confirmation(sid, str(request.payload.request_id), Decision.DENY)
    assert "a human denied the connection" in await asyncio.wait_for(denied, 60)
    await until(lambda: len(_audit(h)) == 2)
    assert [r["reason"] for r in _audit(h)] == ["approved", "prompt_denied"]
