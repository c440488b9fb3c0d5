"""The egress proxy's transport: a file through the sandbox's proxy listener, the agent channel and
the server's proxy, against the host's own download of the same file in the same run; and the
setup latency of a ``CONNECT`` tunnel (from the sandbox's connect to ``200 Connection
established`` through to the origin).

The file server is on the host's loopback, which the bench's own egress policy takes out of
``deny_networks`` (the default refuses 127.0.0.0/8); nothing leaves the machine. The sandbox is the
local backend (the real agent and channel, no container), so the rows measure the transport, not
a runtime.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.env import BenchEnv
from bench.table import Row, percentile
from dispatcher.core.sandbox_api import ExecRequest
from dispatcher.core.session import Session
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, parse_networks
from dispatcher.egress.policy import EgressPolicy
from dispatcher.egress.proxy import EgressContext, TunnelStream, serve_tunnel
from dispatcher.sandbox.local import LocalSandboxProvider

GROUP = "egress"
FILE_BYTES = 64 << 20
SETUPS = 200
_CLIENT = """
import os, socket, sys, time, urllib.request
mode, port = sys.argv[1], int(sys.argv[2])
if mode == "get":
    proxy = os.environ.get("HTTP_PROXY")
    handlers = [urllib.request.ProxyHandler({"http": proxy} if proxy else {})]
    opener = urllib.request.build_opener(*handlers)
    t = time.perf_counter()
    n = 0
    with opener.open(f"http://127.0.0.1:{port}/file", timeout=60) as r:
        while chunk := r.read(1 << 20):
            n += len(chunk)
    print(n, time.perf_counter() - t)
else:
    proxy = os.environ["HTTP_PROXY"].rsplit(":", 1)
    out = []
    for _ in range(int(sys.argv[3])):
        t = time.perf_counter()
        s = socket.create_connection((proxy[0].split("//")[1], int(proxy[1])))
        s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n".encode())
        head = b""
        while b"\\r\\n\\r\\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        out.append((time.perf_counter() - t) * 1000)
        s.close()
    print(" ".join(f"{v:.4f}" for v in out))
"""


class _File(BaseHTTPRequestHandler):
    body = os.urandom(1 << 20) * (FILE_BYTES >> 20)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


class _Gate:
    def __init__(self, ctx: EgressContext) -> None:
        self.ctx = ctx

    def ca_bundle(self, tenant_id: str) -> str | None:
        return None

    async def serve(self, session_id: str, stream: TunnelStream, tool_use_id: str | None) -> None:
        await serve_tunnel(stream, self.ctx, tool_use_id=tool_use_id)


async def measure(env: BenchEnv) -> list[Row]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _File)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    deny = parse_networks(n for n in DEFAULT_DENY_NETWORKS if n != "127.0.0.0/8")
    policy = EgressPolicy(allow=("127.0.0.1",), ports=(port,), deny_networks=deny, max_bytes=1 << 40)
    provider = LocalSandboxProvider()
    provider.egress = _Gate(EgressContext("bench", "bench", policy, allow=policy.allow))
    workspace = env.workspace("egress")
    script = workspace / "client.py"
    script.write_text(_CLIENT)
    sandbox = provider.sandbox_for(Session(session_id="bench", workspace_path=str(workspace)))
    try:
        host = subprocess.run(
            [sys.executable, str(script), "get", str(port)], capture_output=True, text=True, check=True
        ).stdout.split()
        proxied = (await _run(sandbox, f"{sys.executable} client.py get {port}")).split()
        setups = [
            float(v)
            for v in (await _run(sandbox, f"{sys.executable} client.py connect {port} {SETUPS}")).split()
        ]
    finally:
        await provider.aclose()
        server.shutdown()
    rate_host = int(host[0]) / float(host[1]) / 1e6
    rate_proxied = int(proxied[0]) / float(proxied[1]) / 1e6
    return [
        Row(GROUP, "host download (loopback, no proxy)", None, note=f"{rate_host:.0f} MB/s", compare=False),
        Row(
            GROUP,
            "download through the sandbox proxy",
            None,
            note=f"{rate_proxied:.0f} MB/s ({rate_proxied / rate_host:.0%} of the host's)",
            compare=False,
        ),
        Row(
            GROUP,
            "CONNECT setup (sandbox -> 200 established)",
            percentile(setups, 0.5),
            percentile(setups, 0.95),
            len(setups),
        ),
    ]


async def _run(sandbox: Any, command: str) -> str:
    out: list[bytes] = []
    request = ExecRequest(command, timeout=300, env={"NO_PROXY": "", "no_proxy": ""})
    result = await sandbox.exec(request, lambda stream, data: out.append(data), asyncio.Event())
    text = b"".join(out).decode()
    if result.exit_code != 0:
        raise RuntimeError(f"{command!r} failed: {text[-500:]}")
    return text
