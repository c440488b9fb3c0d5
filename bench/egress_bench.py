"""The egress proxy's transport: a file through the sandbox's proxy listener, the agent channel and
the server's proxy, against the host's own download of the same file in the same run; and the
setup latency of a ``CONNECT`` tunnel (from the sandbox's connect to ``200 Connection
established`` through to the origin).

The file server is on the host's loopback, which the bench's own egress policy takes out of
``deny_networks`` (the default refuses 127.0.0.0/8); nothing leaves the machine. The first rows'
sandbox is the local backend (the real agent and channel, no container), so they measure the
transport, not a runtime; when a Docker daemon and the sandbox image answer, the same download
runs in a runc container, its agent on the server's socket (the default) and through
``docker attach`` (``sandbox.agent_socket: false``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import docker

from bench.env import BenchEnv
from bench.table import Row, percentile
from dispatcher.core.sandbox_api import ExecRequest
from dispatcher.core.sessions.session import Session
from dispatcher.egress.networks import DEFAULT_DENY_NETWORKS, parse_networks
from dispatcher.egress.policy import EgressPolicy
from dispatcher.egress.proxy import EgressContext, TunnelStream, serve_tunnel
from dispatcher.sandbox.container.config import DEFAULT_IMAGE, SandboxConfig
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
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


_ORIGIN = """
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BODY = os.urandom(1 << 20) * int(sys.argv[1])
class File(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), File)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
"""The origin, in a process of its own: a remote origin shares no interpreter with the server's
proxy, and one in the bench's process would take its GIL from the proxy it is measured through."""


class _Gate:
    def __init__(self, ctx: EgressContext) -> None:
        self.ctx = ctx

    def ca_bundle(self, tenant_id: str) -> str | None:
        return None

    async def serve(self, session_id: str, stream: TunnelStream, tool_use_id: str | None) -> None:
        await serve_tunnel(stream, self.ctx, tool_use_id=tool_use_id)


async def measure(env: BenchEnv) -> list[Row]:
    origin = subprocess.Popen(
        [sys.executable, "-c", _ORIGIN, str(FILE_BYTES >> 20)], stdout=subprocess.PIPE, text=True
    )
    assert origin.stdout is not None
    port = int(origin.stdout.readline())
    deny = parse_networks(n for n in DEFAULT_DENY_NETWORKS if n != "127.0.0.0/8")
    policy = EgressPolicy(allow=("127.0.0.1",), ports=(port,), deny_networks=deny, max_bytes=1 << 40)
    provider = LocalSandboxProvider()
    provider.egress = _Gate(EgressContext("bench", "bench", policy, allow=policy.allow))
    workspace = env.workspace("egress")
    script = workspace / "client.py"
    script.write_text(_CLIENT)
    gate = _Gate(EgressContext("bench", "bench", policy, allow=policy.allow))
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
        docker_rates = await _docker_rates(env, gate, port) if _docker_answers() else []
    finally:
        await provider.aclose()
        origin.kill()
        origin.wait()
    rate_host = int(host[0]) / float(host[1]) / 1e6
    rate_proxied = int(proxied[0]) / float(proxied[1]) / 1e6
    docker_rows = [
        Row(
            GROUP,
            f"download through the sandbox proxy, runc container, {how}",
            None,
            note=f"{rate:.0f} MB/s ({rate / rate_host:.0%} of the host's)",
            compare=False,
        )
        for how, rate in docker_rates
    ]
    return [
        Row(GROUP, "host download (loopback, no proxy)", None, note=f"{rate_host:.0f} MB/s", compare=False),
        Row(
            GROUP,
            "download through the sandbox proxy",
            None,
            note=f"{rate_proxied:.0f} MB/s ({rate_proxied / rate_host:.0%} of the host's)",
            compare=False,
        ),
        *docker_rows,
        Row(
            GROUP,
            "CONNECT setup (sandbox -> 200 established)",
            percentile(setups, 0.5),
            percentile(setups, 0.95),
            len(setups),
        ),
    ]


def _docker_answers() -> bool:
    try:
        client = docker.from_env(timeout=5)
        try:
            client.ping()
            client.images.get(DEFAULT_IMAGE)
        finally:
            client.close()
    except Exception:
        return False
    return True


async def _docker_rates(env: BenchEnv, gate: _Gate, port: int) -> list[tuple[str, float]]:
    """MB/s of the same download from a runc container, agent on its socket and attached."""
    rates = []
    for how, socket_on in (("agent on the server's socket", True), ("agent through docker attach", False)):
        config = SandboxConfig(workspace_quota=None, agent_socket=socket_on, start_on_create=False)
        provider = DockerSandboxProvider(config, instance=f"{env.instance}-egress")
        provider.egress = gate
        workspace = env.workspace(f"egress-docker-{int(socket_on)}")
        (workspace / "client.py").write_text(_CLIENT)
        os.chown(workspace, 1000, 1000)
        sandbox = provider.sandbox_for(
            Session(session_id=f"bench-{int(socket_on)}", workspace_path=str(workspace))
        )
        try:
            got = (await _run(sandbox, f"python3 client.py get {port}")).split()
        finally:
            await provider.aclose()
        rates.append((how, int(got[0]) / float(got[1]) / 1e6))
    return rates


async def _run(sandbox: Any, command: str) -> str:
    out: list[bytes] = []
    request = ExecRequest(command, timeout=300, env={"NO_PROXY": "", "no_proxy": ""})
    result = await sandbox.exec(request, lambda stream, data: out.append(data), asyncio.Event())
    text = b"".join(out).decode()
    if result.exit_code != 0:
        raise RuntimeError(f"{command!r} failed: {text[-500:]}")
    return text
