"""The Docker API figures the fast path is compared with, measured on a sandbox-like container."""

from __future__ import annotations

import asyncio
import io
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable

import docker

from bench.env import BenchEnv
from bench.table import BASELINE, IDLE_GAP_SECONDS, Row, row
from dispatcher.sandbox.container.config import DEFAULT_IMAGE

FILE_BYTES = 4096


def time_sync(fn: Callable[[], object], n: int, *, warmup: int = 2, gap: float = 0.0) -> list[float]:
    """Latencies in ms of ``n`` sequential calls after ``warmup`` unmeasured ones (``gap``: seconds
    of sleep before each, not timed; see ``bench.table.time_async``)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        if gap:
            time.sleep(gap)
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _tar_of(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.uid = info.gid = 1000
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _measure(env: BenchEnv) -> list[Row]:
    client = docker.from_env()
    api = client.api
    workspace = env.workspace("baseline")
    workspace.chmod(0o777)
    container = client.containers.run(
        DEFAULT_IMAGE,
        ["sleep", "600"],
        detach=True,
        network_mode="none",
        user="1000:1000",
        read_only=True,
        cap_drop=["ALL"],
        init=True,
        labels={"dispatcher.instance": env.instance, "dispatcher.session": "bench-baseline"},
        volumes={str(workspace): {"bind": "/workspace", "mode": "rw"}},
    )
    try:
        cid = container.id

        def exec_true() -> None:
            exec_id = api.exec_create(cid, ["true"])["Id"]
            api.exec_start(exec_id)

        def exec_cli() -> None:
            subprocess.run(["docker", "exec", cid, "true"], check=True)

        (workspace / "f4k.txt").write_bytes(b"x" * FILE_BYTES)
        tar = _tar_of("put4k.txt", b"y" * FILE_BYTES)

        def get_archive() -> None:
            stream, _ = api.get_archive(cid, "/workspace/f4k.txt")
            for _chunk in stream:
                pass

        def put_archive() -> None:
            api.put_archive(cid, "/workspace", tar)

        def run_rm() -> None:
            client.containers.run(DEFAULT_IMAGE, ["true"], remove=True, network_mode="none")

        n = env.docker_iterations
        return [
            row("baseline", BASELINE, time_sync(exec_true, n), "exec_create + exec_start"),
            row("baseline", "docker exec true (CLI)", time_sync(exec_cli, n)),
            row("baseline", "get_archive 4 KiB", time_sync(get_archive, n)),
            row("baseline", "put_archive 4 KiB", time_sync(put_archive, n)),
            row("baseline", "docker run --rm true", time_sync(run_rm, env.cold_iterations, warmup=1)),
        ]
    finally:
        container.remove(force=True)
        client.close()


_ECHO = """
import socket, sys
peer = socket.socket(fileno=int(sys.argv[1]))
while data := peer.recv(65536):
    peer.sendall(data)
"""
PING = b"p" * 64


def _host_round_trips(env: BenchEnv) -> list[Row]:
    """Two host processes answering each other over a unix socket, back to back and after idle.

    No Docker and none of our code: the machine's own cost of waking a process that waits for a
    message. Every call through the service crosses such a wake at least twice (client to server
    and back), a sandbox call twice more (server to agent and back). The sandbox group's "idle
    before each" rows pay it too, and more: the Python on both ends of the agent's socket also
    runs after the pause rather than in a hot loop.
    """
    ours, theirs = socket.socketpair()
    echo = subprocess.Popen([sys.executable, "-c", _ECHO, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    try:

        def ping() -> None:
            ours.sendall(PING)
            got = 0
            while got < len(PING):
                chunk = ours.recv(len(PING) - got)
                if not chunk:
                    raise RuntimeError("the echo process ended")
                got += len(chunk)

        n = env.warm_iterations
        note = "two host processes, 64 bytes each way"
        return [
            row("baseline", "host round trip over a unix socket", time_sync(ping, n, warmup=20), note),
            row(
                "baseline",
                f"host round trip over a unix socket, {IDLE_GAP_SECONDS * 1000:g} ms idle before each",
                time_sync(ping, n, warmup=20, gap=IDLE_GAP_SECONDS),
                note + "; the machine's wake-up cost",
            ),
        ]
    finally:
        ours.close()
        echo.wait(timeout=10)


async def measure(env: BenchEnv) -> list[Row]:
    """The host's own round trip (no Docker), then Docker exec, archive and run baselines
    (blocking calls, run in a thread)."""
    host = await asyncio.to_thread(_host_round_trips, env)
    return [*host, *await asyncio.to_thread(_measure, env)]
