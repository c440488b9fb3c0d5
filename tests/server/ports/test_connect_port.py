"""ConnectPort and ``dispatcher port-forward`` against a live in-process server with the local
sandbox: a server started in the sandbox by the model (``shell`` with ``background: true``) is
reached through the RPC, through the CLI's forward with a Python client and with curl, bytes
byte-identical both ways; half-close, refusals, tenancy, bounds, idle timeout, audit and metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.client.ports import PortConnection
from dispatcher.config import hash_token
from dispatcher.server.sessions import ports as session_ports
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness, ServerFactory
from tests.server.helpers import until

PORT_SERVER = Path(__file__).resolve().parents[2] / "contract" / "port_server.py"
ROOT = Path(__file__).resolve().parents[3]


async def _serve(
    harness: Harness, mode: str, workspace: str = "ports"
) -> tuple[AsyncDispatcherClient, str, int]:
    """A session whose model started ``port_server.py MODE`` in the background; its port."""
    client = harness.client()
    sid = (await client.create_session(workspace)).session_id
    started = await client.call(
        sid, "shell", {"command": f"python3 {PORT_SERVER} {mode} {mode}.port", "background": True}
    )
    assert not started.is_error, started
    portfile = harness.tmp / "ws-alpha" / workspace / f"{mode}.port"
    await until(portfile.exists, f"the {mode} server to listen", timeout=20)
    return client, sid, int(portfile.read_text())


async def _read_all(conn: PortConnection) -> bytes:
    out = bytearray()
    while data := await conn.read():
        out += data
    return bytes(out)


async def test_twenty_megabytes_echo_through_connect_port_byte_identical(harness: Harness) -> None:
    client, sid, port = await _serve(harness, "echo")
    payload = os.urandom(1 << 20) * 20
    conn = await client.connect_port(sid, port)
    try:

        async def send() -> None:
            for i in range(0, len(payload), 1 << 20):
                await conn.write(payload[i : i + (1 << 20)])
            await conn.shut_write()

        sender = asyncio.ensure_future(send())
        back = await _read_all(conn)
        await sender
    finally:
        await conn.close()
    assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()


async def test_the_clients_half_close_reaches_the_server_and_its_answer_comes_back(harness: Harness) -> None:
    client, sid, port = await _serve(harness, "count")
    conn = await client.connect_port(sid, port)
    try:
        await conn.write(b"z" * 4321)
        await conn.shut_write()
        assert await _read_all(conn) == b"got 4321"
    finally:
        await conn.close()


async def test_refusals_say_why(harness: Harness) -> None:
    client, sid, port = await _serve(harness, "count")
    with pytest.raises(RequestFailed) as err:
        await client.connect_port(sid, 0)
    assert err.value.code == "INVALID_ARGUMENT" and "1-65535" in err.value.details
    with pytest.raises(RequestFailed) as err:
        await client.connect_port(sid, 70000)
    assert err.value.code == "INVALID_ARGUMENT"
    free = _free_port()
    with pytest.raises(RequestFailed) as err:
        await client.connect_port(sid, free)
    assert err.value.code == "UNAVAILABLE" and f"nothing listens on port {free}" in err.value.details
    # Another tenant's session does not exist for it, whatever the port.
    with pytest.raises(RequestFailed) as err:
        await harness.client(TOKEN_BETA).connect_port(sid, port)
    assert err.value.code == "NOT_FOUND"


async def test_the_sessions_and_the_tenants_bounds_on_open_connections(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    harness = await make_server(
        tenants=[_alpha_with(tmp_path, max_port_connections=3, max_port_connections_per_session=2)]
    )
    client, sid, port = await _serve(harness, "count", "one")
    _, sid2, port2 = await _serve(harness, "count", "two")
    held = [await client.connect_port(sid, port), await client.connect_port(sid, port)]
    with pytest.raises(RequestFailed) as err:
        await client.connect_port(sid, port)
    assert err.value.code == "RESOURCE_EXHAUSTED" and "max_port_connections_per_session" in err.value.details
    held.append(await client.connect_port(sid2, port2))
    with pytest.raises(RequestFailed) as err:
        await client.connect_port(sid2, port2)
    assert err.value.code == "RESOURCE_EXHAUSTED" and "max_port_connections" in err.value.details
    # Closing one frees its slot: a connection opens again.
    await held.pop(0).close()
    await until(lambda: _opens(client, sid, port), "a slot to free up")
    for conn in held:
        await conn.close()


async def _opens(client: AsyncDispatcherClient, sid: str, port: int) -> bool:
    try:
        conn = await client.connect_port(sid, port)
    except RequestFailed:
        return False
    await conn.close()
    return True


async def test_a_stalled_sandbox_reader_holds_the_client_at_a_bounded_window(harness: Harness) -> None:
    client, sid, port = await _serve(harness, "sink")
    conn = await client.connect_port(sid, port)
    written = 0
    total = 96 << 20

    async def send() -> None:
        nonlocal written
        block = b"s" * (256 << 10)
        while written < total:
            await conn.write(block)
            written += len(block)
        await conn.shut_write()

    sender = asyncio.ensure_future(send())
    seen: list[int] = []

    def stalled() -> bool:
        seen.append(written)
        return len(seen) > 20 and len(set(seen[-20:])) == 1

    try:
        await until(stalled, "the client's writes to stall", timeout=30, interval=0.05)
        assert not sender.done()
        # gRPC's windows, the server's one message, the agent's window and the kernel's buffers.
        assert written < 32 << 20, written
        (harness.tmp / "ws-alpha" / "ports" / "go").write_text("")
        assert await _read_all(conn) == b"got %d" % total
        await sender
    finally:
        await conn.close()


async def test_an_idle_connection_is_closed_and_audited_without_its_bytes(
    make_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(session_ports, "IDLE_SECONDS", 0.5)
    audit = tmp_path / "audit.jsonl"
    harness = await make_server(audit_log=str(audit))
    client, sid, port = await _serve(harness, "echo")
    conn = await client.connect_port(sid, port)
    await conn.write(b"secret-bytes")
    assert await conn.read() == b"secret-bytes"
    assert await conn.read() == b""  # nothing for IDLE_SECONDS: the server ended it
    await conn.close()

    def records() -> list[dict[str, object]]:
        lines = audit.read_text().splitlines() if audit.exists() else []
        return [r for r in map(json.loads, lines) if r.get("kind") == session_ports.AUDIT_CONNECT]

    await until(lambda: bool(records()), "the audit record")
    (record,) = records()
    assert record["outcome"] == "idle" and record["port"] == port and record["session"] == sid
    assert record["bytes_to_sandbox"] == 12 and record["bytes_from_sandbox"] == 12
    assert "secret-bytes" not in audit.read_text()


async def test_port_forward_serves_a_python_client_and_curl(harness: Harness) -> None:
    _, sid, port = await _serve(harness, "http")
    blob = os.urandom(3 << 20)
    (harness.tmp / "ws-alpha" / "ports" / "blob.bin").write_bytes(blob)
    env = {**os.environ, "DISPATCHER_TOKEN": TOKEN_ALPHA}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dispatcher.cli", "port-forward", "--server", harness.target, sid, f"0:{port}",
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("Forwarding from 127.0.0.1:") and line.rstrip().endswith(f"-> {port}")
        url = f"http://127.0.0.1:{line.split('127.0.0.1:')[1].split()[0]}/blob.bin"
        for _ in range(3):  # a connection each, one gRPC stream each
            assert await asyncio.to_thread(_get, url) == blob
        curl = shutil.which("curl")
        assert curl is not None, "curl is part of the development machine (scripts/bootstrap.sh)"
        out = await asyncio.create_subprocess_exec(
            curl, "-sf", "--max-time", "30", url, stdout=asyncio.subprocess.PIPE
        )
        body, _ = await out.communicate()
        assert out.returncode == 0 and body == blob
    finally:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), 30)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        body: bytes = response.read()
        return body


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _alpha_with(tmp: Path, **quotas: int) -> dict[str, object]:
    return {
        "id": "alpha",
        "token_sha256": [hash_token(TOKEN_ALPHA)],
        "workspace_root": str(tmp / "ws-alpha"),
        "tool_confirmation": {"default": {"EXECUTE": "auto"}},
        "quotas": quotas,
    }


async def test_bytes_and_outcomes_are_metered_per_tenant(make_server: ServerFactory) -> None:
    harness = await make_server(metrics={"listen": "127.0.0.1:0"})
    metrics = harness.server.observability.metrics
    assert metrics is not None
    client, sid, port = await _serve(harness, "count")
    conn = await client.connect_port(sid, port)
    await conn.write(b"m" * 5000)
    await conn.shut_write()
    assert await _read_all(conn) == b"got 5000"
    await conn.close()
    with pytest.raises(RequestFailed):
        await client.connect_port(sid, _free_port())

    def sample(name: str, **labels: str) -> float:
        value = metrics.registry.get_sample_value(name, {"tenant": "alpha", **labels})
        return value or 0.0

    await until(lambda: sample("dispatcher_preview_connections_total", outcome="closed") == 1, "the metrics")
    assert sample("dispatcher_preview_bytes_total", direction="in") == 5000
    assert sample("dispatcher_preview_bytes_total", direction="out") == len(b"got 5000")
    assert sample("dispatcher_preview_connections_total", outcome="refused") == 1
