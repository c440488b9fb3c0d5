"""What metrics cost a call: warm ``shell true`` through gRPC with ``metrics:`` off and on.

The same server config both ways, started in turn as off-on, on-off, ... (whichever server runs
second in a pair measures slower: the first one's teardown still runs), so drift and order fall on
both alike; with metrics on, a scraper reads ``/metrics`` every 0.5 s as Prometheus would.
Issue 9's target: the p50 with metrics on within 10 % of the p50 with them off.
"""

from __future__ import annotations

import secrets
import socket
import threading
import urllib.request
from typing import Any

from bench.env import BenchEnv
from bench.grpc_bench import _check, _docker_answers, _start_server, _stop_server
from bench.table import Row, percentile, row, time_async
from dispatcher.client import AsyncDispatcherClient

GROUP = "grpc"
ROUNDS = 4
SCRAPE_EVERY = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scraper(port: int, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.wait(SCRAPE_EVERY):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    response.read()
            except OSError:
                pass  # the server is starting or stopping

    thread = threading.Thread(target=run, name="bench-scraper", daemon=True)
    thread.start()
    return thread


async def _shell_true(env: BenchEnv, token: str, backend: str, metrics: bool, n: int) -> list[float]:
    # Sessions (and the workspace volume they hold) end with each server: the next one starts clean.
    extra: dict[str, Any] = {"shutdown": {"remove_sessions": True}}
    port = 0
    if metrics:
        port = _free_port()
        extra["metrics"] = {"listen": f"127.0.0.1:{port}"}
    proc, target = _start_server(env, token, backend, extra)
    stop = threading.Event()
    scraper = _scraper(port, stop) if metrics else None
    try:
        async with AsyncDispatcherClient(target, token=token) as client:
            sid = (await client.create_session(f"metrics-{secrets.token_hex(3)}")).session_id

            async def call() -> None:
                _check(await client.call(sid, "shell", {"command": "true"}))

            return await time_async(call, n, warmup=5)
    finally:
        stop.set()
        if scraper is not None:
            scraper.join(timeout=10)
        _stop_server(proc)


async def measure(env: BenchEnv) -> list[Row]:
    """p50 of warm shell true with metrics off and on, and their ratio."""
    backend = "docker" if _docker_answers() else "local"
    note = "" if backend == "docker" else "local sandbox: no Docker daemon/image; "
    token = secrets.token_urlsafe(24)
    n = max(env.warm_iterations // ROUNDS, 5)
    off: list[float] = []
    on: list[float] = []
    for i in range(ROUNDS):
        for metrics in (False, True) if i % 2 == 0 else (True, False):
            samples = await _shell_true(env, token, backend, metrics, n)
            (on if metrics else off).extend(samples)
    ratio = percentile(on, 0.5) / percentile(off, 0.5)
    return [
        row(
            GROUP,
            "shell true via gRPC (warm), metrics off",
            off,
            note + f"{ROUNDS} servers each way, in ABBA order",
        ),
        row(
            GROUP,
            "shell true via gRPC (warm), metrics on",
            on,
            note + f"p50 on/off = {ratio:.3f} (target <= 1.10); /metrics scraped every {SCRAPE_EVERY} s",
        ),
    ]
