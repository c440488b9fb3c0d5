"""New session -> first result from the warm pool, while sessions are created at a steady rate.

A ``dispatcher serve`` (Docker backend) with ``sandbox.warm_pool.size`` as large as the burst
(``BenchEnv.pool_sessions``: the README's sizing rule, since this machine refills far slower than
10 containers a second) waits until its pool is full; then a new session is created every 1/``RATE`` s (each on its own task,
as independent agents would), and each makes one ``shell true`` call. The figure is from just
before CreateSession to the result. The note says how many adopted a pooled container (the
server's ``dispatcher_sandbox_pool_*`` metrics) and how fast the pool refilled meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
import urllib.request

from bench.env import BenchEnv
from bench.grpc_bench import _check, _docker_answers, _start_server, _stop_server
from bench.metrics_bench import _free_port
from bench.table import Row, percentile
from dispatcher.client import AsyncDispatcherClient

GROUP = "pool"
RATE = float(os.environ.get("BENCH_POOL_RATE", "10"))
"""New sessions per second."""


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def measure(env: BenchEnv) -> list[Row]:
    """One row: new session -> first shell result, p50 and p99, with the pool's hit count."""
    if not _docker_answers():
        return [Row(GROUP, "new session → first result (warm pool)", None, note="skipped: no Docker")]
    token = secrets.token_urlsafe(24)
    sessions = env.pool_sessions
    pool_size = sessions
    metrics_port = _free_port()
    proc, target = _start_server(
        env,
        token,
        "docker",
        extra={"metrics": {"listen": f"127.0.0.1:{metrics_port}"}, "shutdown": {"remove_sessions": True}},
        sandbox_options={"warm_pool": {"size": pool_size}, "workspace_quota": None},
    )
    latencies: list[float] = []
    try:
        async with AsyncDispatcherClient(target, token=token) as client:
            # A first session (the pool fills for the configured tenant and its uid from the start;
            # this one also warms the server's paths before the clock runs).
            first = (await client.create_session("pool-first")).session_id
            _check(await client.call(first, "shell", {"command": "true"}))
            deadline = time.monotonic() + 120
            while await asyncio.to_thread(_metric, metrics_port, "dispatcher_sandbox_pool_ready") < pool_size:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the warm pool did not fill to {pool_size} in 120 s")
                await asyncio.sleep(0.2)

            async def one(i: int) -> None:
                started = time.perf_counter()
                sid = (await client.create_session(f"pool-{i}")).session_id
                _check(await client.call(sid, "shell", {"command": "true"}))
                latencies.append((time.perf_counter() - started) * 1000)

            began = time.monotonic()
            tasks = []
            for i in range(sessions):
                await asyncio.sleep(max(0.0, began + i / RATE - time.monotonic()))
                tasks.append(asyncio.ensure_future(one(i)))
            await asyncio.gather(*tasks)
            spent = time.monotonic() - began
        hits = await asyncio.to_thread(
            _metric, metrics_port, 'dispatcher_sandbox_pool_takes_total{outcome="hit"}'
        )
        hits -= 1  # the first session's
        misses = await asyncio.to_thread(
            _metric, metrics_port, 'dispatcher_sandbox_pool_takes_total{outcome="miss"}'
        )
    finally:
        _stop_server(proc)
    note = f"{sessions} sessions at {RATE:g}/s ({spent:.1f} s), pool size {pool_size}; p99 {percentile(latencies, 0.99):.1f} ms"
    note += f"; {hits:.0f} adopted, {misses:.0f} launched"
    return [
        Row(
            GROUP,
            f"new session → first shell result, warm pool, {RATE:g} sessions/s",
            percentile(latencies, 0.5),
            percentile(latencies, 0.95),
            len(latencies),
            note=note,
        )
    ]
