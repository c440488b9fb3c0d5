"""The preview gateway and ConnectPort, against the same server reached from inside the sandbox, in
the same run (the egress tunnel's figures, the other direction of the same channel, are the
egress rows of this table).

A server in-process, on the Docker backend when a daemon answers (else the local backend: the
real agent and channel, no container; the rows say which), whose session runs
``tests/contract/port_server.py http`` (copied into its workspace) in the background, as a model's
``shell`` call starts it. The HTTP client is a process of its own (``_CLIENT``), run once on the
host through the gateway and once inside the sandbox straight to the port (the in-sandbox
baseline: what ``docker exec curl`` measures for a container): a small GET's latency over one keep-alive connection, and a 100 MB
download's throughput. Then 100 MB to the sandbox through ConnectPort (byte count checked), and a
WebSocket round trip through the gateway.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import time
from pathlib import Path

import aiohttp
import yaml

from bench.env import BenchEnv
from bench.grpc_bench import _docker_answers
from bench.table import Row, percentile
from dispatcher.client import AsyncDispatcherClient
from dispatcher.config import hash_token
from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.server.app import build_server
from dispatcher.server.preview.gateway import HEADER

GROUP = "preview"
BIG = 100 << 20
SMALL_REQUESTS = 300
ROUND_TRIPS = 300
PORT_SERVER = Path(__file__).resolve().parents[1] / "tests" / "contract" / "port_server.py"
TOKEN = "bench-preview-token-0123456789"
_CLIENT = """
import http.client, sys, time
host, port, vhost, token, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
headers = {"Host": vhost, "X-Dispatcher-Preview-Token": token} if token else {}
conn = http.client.HTTPConnection(host, port, timeout=120)
out = []
for _ in range(n):
    t = time.perf_counter()
    conn.request("GET", "/small.txt", headers=headers)
    r = conn.getresponse()
    assert r.status == 200 and r.read() == b"x" * 1024
    out.append((time.perf_counter() - t) * 1000)
t = time.perf_counter()
conn.request("GET", "/big.bin", headers=headers)
r = conn.getresponse()
got = 0
while chunk := r.read(1 << 20):
    got += len(chunk)
out.append(got / (time.perf_counter() - t) / 1e6)
print(" ".join(f"{v:.4f}" for v in out))
"""


async def measure(env: BenchEnv) -> list[Row]:
    home = env.workspace("preview")
    docker = _docker_answers()
    config = {
        "home": str(home / "home"),
        "listen": "127.0.0.1:0",
        "log": {"format": "json", "level": "warning"},
        "tool_confirmation": {"preset": "autonomous"},
        "sandbox": (
            {"backend": "docker", "instance": env.instance, "workspace_quota": None}
            if docker
            else {"backend": "local"}
        ),
        "preview": {"listen": "127.0.0.1:0", "domain": "localhost"},
        "tenants": [{"id": "bench", "token_sha256": hash_token(TOKEN), "workspace_root": str(home / "ws")}],
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    loaded, _ = ensure_default_tenant(load_config(path, env={}))
    server = build_server(loaded)
    await server.start()
    client = AsyncDispatcherClient(f"127.0.0.1:{server.port}", token=TOKEN, home=str(home / "nohome"))
    try:
        rows = await _measure(server, client, home)
    finally:
        await client.close()
        await server.stop(grace=1)
    where = "Docker" if docker else "local backend (no Docker)"
    return [Row(r.group, f"{r.name} [{where}]", r.p50_ms, r.p95_ms, r.n, r.note, r.compare) for r in rows]


async def _measure(server: object, client: AsyncDispatcherClient, home: Path) -> list[Row]:
    sid = (await client.create_session("site")).session_id
    root = home / "ws" / "site"
    (root / "small.txt").write_bytes(b"x" * 1024)
    (root / "big.bin").write_bytes(os.urandom(1 << 20) * (BIG >> 20))
    (root / "client.py").write_text(_CLIENT)
    (root / "port_server.py").write_text(PORT_SERVER.read_text())
    await client.call(sid, "shell", {"command": "python3 port_server.py http http.port", "background": True})
    await client.call(
        sid, "shell", {"command": "python3 port_server.py count count.port", "background": True}
    )
    await client.call(sid, "shell", {"command": "python3 port_server.py echo echo.port", "background": True})
    for name in ("http.port", "count.port", "echo.port"):
        for _ in range(400):
            if (root / name).exists():
                break
            await asyncio.sleep(0.05)
    port = int((root / "http.port").read_text())
    count_port = int((root / "count.port").read_text())
    opened = await client.open_port(sid, port)
    gw = opened.url.split(":")[2].rstrip("/")
    vhost = f"{port}-{sid}.localhost"

    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(root / "client.py"), "127.0.0.1", gw, vhost, opened.token, str(SMALL_REQUESTS),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    through = [float(v) for v in out.split()]
    inside = await client.call(
        sid, "shell",
        {"command": f"python3 client.py 127.0.0.1 {port} x '' {SMALL_REQUESTS}", "timeout_seconds": 300},
    )  # fmt: skip
    baseline = [float(v) for v in str(inside.content[0].text if inside.content else "").split()]  # type: ignore[union-attr]

    conn = await client.connect_port(sid, count_port)
    block = b"f" * (1 << 20)
    started = time.perf_counter()
    for _ in range(BIG >> 20):
        await conn.write(block)
    await conn.shut_write()
    answer = await conn.read()
    forward_rate = BIG / (time.perf_counter() - started) / 1e6
    await conn.close()
    assert answer == b"got %d" % BIG, answer
    echo_rate = await _echo(client, sid, int((root / "echo.port").read_text()))

    trips = []
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"http://127.0.0.1:{gw}/ws", headers={"Host": vhost, HEADER: opened.token}) as ws,
    ):
        for i in range(ROUND_TRIPS):
            t = time.perf_counter()
            await ws.send_str(str(i))
            assert await ws.receive_str() == str(i)
            trips.append((time.perf_counter() - t) * 1000)

    small, rate = through[:-1], through[-1]
    base_small, base_rate = baseline[:-1], baseline[-1]
    return [
        Row(GROUP, "GET 1 KiB in the sandbox, straight to the port (baseline)", percentile(base_small, 0.5),
            percentile(base_small, 0.95), len(base_small)),
        Row(GROUP, "GET 1 KiB through the preview gateway (keep-alive)", percentile(small, 0.5),
            percentile(small, 0.95), len(small)),
        Row(GROUP, "100 MB download in the sandbox, straight to the port (baseline)", None,
            note=f"{base_rate:.0f} MB/s", compare=False),
        Row(GROUP, "100 MB download through the preview gateway", None,
            note=f"{rate:.0f} MB/s ({rate / base_rate:.0%} of the in-sandbox baseline)", compare=False),
        Row(GROUP, "100 MB to the sandbox through ConnectPort (port-forward)", None,
            note=f"{forward_rate:.0f} MB/s", compare=False),
        Row(GROUP, "100 MB to the sandbox and back through ConnectPort, byte-identical (sha256)", None,
            note=f"{echo_rate:.0f} MB/s each way", compare=False),
        Row(GROUP, "WebSocket round trip through the preview gateway", percentile(trips, 0.5),
            percentile(trips, 0.95), len(trips)),
    ]  # fmt: skip


async def _echo(client: AsyncDispatcherClient, sid: str, port: int) -> float:
    """100 MB of random bytes to an echo server in the sandbox, read back as they come; the
    rate each way, once the bytes back hash as the bytes sent."""
    payload = os.urandom(1 << 20) * (BIG >> 20)
    conn = await client.connect_port(sid, port)
    back = hashlib.sha256()
    got = 0

    async def reader() -> None:
        nonlocal got
        while data := await conn.read():
            back.update(data)
            got += len(data)

    started = time.perf_counter()
    reading = asyncio.create_task(reader())
    for i in range(0, BIG, 1 << 20):
        await conn.write(payload[i : i + (1 << 20)])
    await conn.shut_write()
    await reading
    rate = BIG / (time.perf_counter() - started) / 1e6
    await conn.close()
    if got != BIG or back.digest() != hashlib.sha256(payload).digest():
        raise RuntimeError(f"ConnectPort echo: {got} bytes back, not the {BIG} sent")
    return rate
