"""One tenant floods hostile inputs; does anyone else notice? (issue 7, point 3)

A ``dispatcher serve`` subprocess with two tenants. First the quiet figures: a health check and
tenant ``quiet``'s ``read_file`` of 4 KiB. Then tenant ``flood`` keeps ``FLOODERS`` Dispatch streams
busy with hostile inputs (the reported 4 KB secret-redaction trap, 3.5 MB strings of the same,
2 M levels of nesting, thousands of values) and the same two figures are measured again.
Requests are pre-serialised and sent as raw bytes, so the flooding client costs little CPU and
the server, not the client, is what is measured.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.env import BenchEnv
from bench.grpc_bench import FILE, _check, _docker_answers, _spawn, _stop_server
from bench.table import Row, percentile
from dispatcher.client import AsyncDispatcherClient
from dispatcher.config import hash_token
from dispatcher.v1 import dispatcher_pb2 as pb

GROUP = "isolation"
FLOODERS = 4
BIG = 3_500_000  # characters: under the default 4 MiB message limit with the envelope


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _hostile_inputs() -> list[tuple[str, str]]:
    """(tool name, input_json) pairs a hostile tenant sends."""
    trap = _fill("passwd.", 1999)
    return [
        ("no_such_tool", json.dumps({"a": trap, "b": trap})),  # the reported 4 KB input
        ("no_such_tool", json.dumps({"a": _fill("passwd.", BIG)})),
        ("noop", json.dumps({"text": _fill('password="', BIG)})),
        ("noop", "[" * (BIG // 2) + "]" * (BIG // 2)),
        ("noop", json.dumps({f"k{i}": _fill("passwd.", 300) for i in range(9_000)})),
    ]


def _start(env: BenchEnv, tokens: dict[str, str], backend: str) -> tuple[Any, str]:
    home = env.workspace("isolation-home")
    sandbox: dict[str, Any] = {"backend": backend}
    if backend == "docker":
        sandbox["instance"] = env.instance
    config = {
        "home": str(home),
        "log": {"format": "json", "level": "error"},
        "tool_confirmation": {"preset": "autonomous"},
        "sandbox": sandbox,
        "tools": ["bench.grpc_bench:make_noop_tool"],
        "tenants": [
            {"id": tenant, "token_sha256": hash_token(token), "workspace_root": str(home / f"ws-{tenant}")}
            for tenant, token in tokens.items()
        ],
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    repo = str(Path(__file__).resolve().parents[1])
    argv = [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(path), "--listen", "127.0.0.1:0"]
    return _spawn(argv, repo)


async def _samples(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def _flood(target: str, token: str, session_id: str, stop: asyncio.Event, done: list[int]) -> None:
    """One hostile client: Dispatch after Dispatch of raw pre-serialised requests until ``stop``."""
    bodies = [
        pb.DispatchRequest(
            session_id=session_id, tool_uses=[pb.ToolUse(id=f"h{i}", name=name, input_json=raw)]
        ).SerializeToString()
        for i, (name, raw) in enumerate(_hostile_inputs())
    ]
    metadata = (("authorization", f"Bearer {token}"),)
    options = [("grpc.max_send_message_length", 8 << 20)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        dispatch = channel.unary_stream("/dispatcher.v1.ToolDispatcher/Dispatch")
        i = 0
        while not stop.is_set():
            async for _ in dispatch(bodies[i % len(bodies)], metadata=metadata):
                pass
            done[0] += 1
            i += 1


async def measure(env: BenchEnv) -> list[Row]:
    """Health check and another tenant's read_file, quiet and while one tenant floods."""
    backend = "docker" if _docker_answers() else "local"
    tokens = {"quiet": secrets.token_urlsafe(24), "flood": secrets.token_urlsafe(24)}
    proc, target = _start(env, tokens, backend)
    n = max(50, env.warm_iterations)
    try:
        async with (
            AsyncDispatcherClient(target, token=tokens["quiet"]) as quiet,
            AsyncDispatcherClient(target, token=tokens["flood"]) as flooder,
            grpc.aio.insecure_channel(target) as channel,
        ):
            health = health_pb2_grpc.HealthStub(channel)
            session = await quiet.create_session("iso")
            Path(session.workspace_path, "4k.txt").write_bytes(FILE)
            flood_session = (await flooder.create_session("flood")).session_id

            async def check() -> None:
                await health.Check(health_pb2.HealthCheckRequest(), timeout=30)

            async def read() -> None:
                _check(await quiet.call(session.session_id, "read_file", {"path": "4k.txt"}))

            await _samples(read, 5)
            calm = (await _samples(check, n), await _samples(read, n))
            stop, done = asyncio.Event(), [0]
            floods = [
                asyncio.ensure_future(_flood(target, tokens["flood"], flood_session, stop, done))
                for _ in range(FLOODERS)
            ]
            try:
                while done[0] < FLOODERS:  # every flooder has had a request through
                    await asyncio.sleep(0.05)
                started, before = time.perf_counter(), done[0]
                busy = (await _samples(check, n), await _samples(read, n))
                rate = (done[0] - before) / (time.perf_counter() - started)
            finally:
                stop.set()
                await asyncio.gather(*floods, return_exceptions=True)
    finally:
        _stop_server(proc)
    note = f"{FLOODERS} clients of tenant flood, {rate:.0f} hostile requests/s ({backend} sandbox)"
    return [
        _row("health check while another tenant floods", busy[0], calm[0], note, "p99", 0.99),
        _row("read_file 4 KiB while another tenant floods", busy[1], calm[1], note, "p50", 0.5),
    ]


def _row(name: str, busy: list[float], calm: list[float], note: str, label: str, q: float) -> Row:
    side_by_side = (
        f"{label}: quiet {percentile(calm, q):.2f} ms, flooded {percentile(busy, q):.2f} ms; {note}"
    )
    return Row(GROUP, name, percentile(busy, 0.5), percentile(busy, 0.95), len(busy), side_by_side)
