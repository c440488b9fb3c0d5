"""One tenant floods its egress proxy with connections; does another tenant notice? (issue 20)

A ``dispatcher serve`` subprocess with two tenants, as in ``isolation_bench``. Tenant ``flood``
may reach one origin on the host's loopback (its egress section takes 127.0.0.0/8 out of
``deny_networks``; nothing leaves the machine); tenant ``quiet`` has no egress. First tenant
``quiet``'s ``read_file`` of 4 KiB is timed alone; then a command in tenant ``flood``'s sandbox opens
``CONNECT`` tunnels from ``THREADS`` threads as fast as the proxy answers (bounded by
``MAX_CONNECTIONS`` and ``MAX_SECONDS``), and the same reads are timed again. The origin runs in its
own process, so the measuring client shares its process with nothing but itself.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.env import BenchEnv
from bench.grpc_bench import FILE, _check, _docker_answers, _spawn, _stop_server
from bench.isolation_bench import _row, _samples
from bench.table import Row
from dispatcher.client import AsyncDispatcherClient
from dispatcher.config import hash_token
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS

GROUP = "isolation"
THREADS = 8
MAX_CONNECTIONS = 50_000
MAX_SECONDS = 120
"""Bounds of the flood, should the bench fail to stop it (it stops once the reads are timed)."""
_ORIGIN = """
import asyncio
async def handle(reader, writer):
    while await reader.read(65536):
        pass
    writer.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""
_FLOOD = """
import os, socket, sys, threading, time
port, limit, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
host, proxy_port = os.environ["HTTP_PROXY"].split("//")[1].rsplit(":", 1)
lock = threading.Lock()
counts = {"established": 0, "refused": 0}
deadline = time.monotonic() + seconds
def one():
    while not os.path.exists("stop") and time.monotonic() < deadline:
        with lock:
            if counts["established"] + counts["refused"] >= limit:
                return
        s = socket.create_connection((host, int(proxy_port)), timeout=30)
        s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n".encode())
        head = b""
        while b"\\r\\n\\r\\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        s.close()
        with lock:
            counts["established" if head.startswith(b"HTTP/1.1 200") else "refused"] += 1
        if not os.path.exists("started"):
            open("started", "w").close()
started = time.monotonic()
threads = [threading.Thread(target=one) for _ in range(int(sys.argv[4]))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(counts["established"], counts["refused"], time.monotonic() - started)
"""


def _config(env: BenchEnv, tokens: dict[str, str], backend: str, origin_port: int) -> Path:
    home = env.workspace("egress-flood-home")
    sandbox: dict[str, Any] = {"backend": backend}
    if backend == "docker":
        sandbox["instance"] = env.instance
    egress = {
        "allow": ["127.0.0.1"],
        "ports": [origin_port],
        "deny_networks": [n for n in DEFAULT_DENY_NETWORKS if n != "127.0.0.0/8"],
        "max_connections": 64,
    }
    tenants = []
    for tenant, token in tokens.items():
        entry: dict[str, Any] = {
            "id": tenant,
            "token_sha256": hash_token(token),
            "workspace_root": str(home / f"ws-{tenant}"),
        }
        if tenant == "flood":
            entry["egress"] = egress
        tenants.append(entry)
    config = {
        "home": str(home),
        "log": {"format": "json", "level": "error"},
        "tool_confirmation": {"preset": "autonomous"},
        "sandbox": sandbox,
        "tenants": tenants,
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def measure(env: BenchEnv) -> list[Row]:
    """Tenant quiet's read_file, alone and while tenant flood opens egress connections."""
    backend = "docker" if _docker_answers() else "local"
    tokens = {"quiet": secrets.token_urlsafe(24), "flood": secrets.token_urlsafe(24)}
    origin = subprocess.Popen([sys.executable, "-c", _ORIGIN], stdout=subprocess.PIPE, text=True)
    assert origin.stdout is not None
    port = int(origin.stdout.readline())
    path = _config(env, tokens, backend, port)
    repo = str(Path(__file__).resolve().parents[1])
    argv = [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(path), "--listen", "127.0.0.1:0"]
    proc, target = _spawn(argv, repo)
    n = max(50, env.warm_iterations)
    try:
        async with (
            AsyncDispatcherClient(target, token=tokens["quiet"]) as quiet,
            AsyncDispatcherClient(target, token=tokens["flood"]) as flooder,
        ):
            session = await quiet.create_session("quiet")
            Path(session.workspace_path, "4k.txt").write_bytes(FILE)
            flood_session = await flooder.create_session("flood")
            flood_dir = Path(flood_session.workspace_path)
            (flood_dir / "flood.py").write_text(_FLOOD)

            async def read() -> None:
                _check(await quiet.call(session.session_id, "read_file", {"path": "4k.txt"}))

            await _samples(read, 5)
            calm = await _samples(read, n)
            command = f"python3 flood.py {port} {MAX_CONNECTIONS} {MAX_SECONDS} {THREADS}"
            flood = asyncio.ensure_future(
                flooder.call(flood_session.session_id, "shell", {"command": command, "timeout_seconds": 300})
            )
            deadline = time.monotonic() + 120
            while not (flood_dir / "started").exists():  # a tunnel went through: the flood is on
                if flood.done() or time.monotonic() > deadline:
                    raise RuntimeError(f"the flood did not start: {flood.result() if flood.done() else ''}")
                await asyncio.sleep(0.05)
            busy = await _samples(read, n)
            (flood_dir / "stop").touch()
            result = await asyncio.wait_for(flood, 300)
    finally:
        _stop_server(proc)
        origin.kill()
        origin.wait()
    _check(result)
    text = "".join(getattr(block, "text", "") for block in result.content)
    established, refused, seconds = text.split()[-3:]
    rate = (int(established) + int(refused)) / float(seconds)
    note = (
        f"tenant flood: {THREADS} threads, {rate:.0f} CONNECTs/s through its proxy "
        f"({established} established, {refused} refused) ({backend} sandbox)"
    )
    return [_row("read_file 4 KiB while another tenant floods egress", busy, calm, note, "p50", 0.5)]
