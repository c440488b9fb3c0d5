"""Session lifecycle: what a resume costs the call that needs it, and what 1,000 expirations cost.

- pause -> resume -> first result: a real ``dispatcher serve`` on the Docker backend; the session
  is paused (``docker pause``) and a ``shell true`` call resumes it transparently. The row is that
  call's latency; its note the added time over the same call on a running session (target < 50 ms).
- 1,000 expirations: the core's scheduler and lifecycle in this process (an in-memory sandbox, so
  the figure is the dispatcher's own work): 1,000 idle sessions come due at once; wall time and
  CPU seconds until every one is closed.
"""

from __future__ import annotations

import secrets
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.env import BenchEnv
from bench.grpc_bench import _check, _docker_answers, _spawn, _stop_server
from bench.table import Row, percentile
from dispatcher.client import AsyncDispatcherClient
from dispatcher.config import hash_token
from dispatcher.core.dispatcher import ToolDispatcher
from dispatcher.core.sessions.clock import Lifetime
from dispatcher.core.sessions.session import Session, SessionStatus
from dispatcher.sandbox.fake import FakeSandboxProvider
from dispatcher.v1 import dispatcher_pb2 as pb

GROUP = "lifecycle"
RESUME_TARGET_MS = 50.0
EXPIRATIONS = 1000


def _config(env: BenchEnv, home: Path, token: str) -> Path:
    config: dict[str, Any] = {
        "home": str(home),
        "log": {"format": "json", "level": "warning"},
        "tool_confirmation": {"preset": "autonomous"},
        "sandbox": {"backend": "docker", "instance": env.instance, "workspace_quota": None},
        "shutdown": {"remove_sessions": True},
        "tenants": [{"id": "bench", "token_sha256": hash_token(token), "workspace_root": str(home / "ws")}],
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


async def _resume_rows(env: BenchEnv) -> list[Row]:
    if not _docker_answers():
        return [
            Row(GROUP, "pause -> resume -> first result (skipped)", None, note="no Docker", compare=False)
        ]
    token = secrets.token_urlsafe(24)
    home = env.workspace("lifecycle-home")
    repo = str(Path(__file__).resolve().parents[1])
    proc, target = _spawn(
        [
            sys.executable,
            "-m",
            "dispatcher.cli",
            "serve",
            "--config",
            str(_config(env, home, token)),
            "--listen",
            "127.0.0.1:0",
        ],
        repo,
    )
    try:
        async with AsyncDispatcherClient(target, token=token, timeout=120) as client:
            sid = (await client.create_session("w")).session_id
            _check(await client.call(sid, "shell", {"command": "true"}))
            warm: list[float] = []
            resumed: list[float] = []
            for _ in range(env.cold_iterations * 2):
                started = time.perf_counter()
                _check(await client.call(sid, "shell", {"command": "true"}))
                warm.append((time.perf_counter() - started) * 1000)
                await client._stub.PauseSession(
                    pb.PauseSessionRequest(session_id=sid), metadata=client._metadata
                )
                started = time.perf_counter()
                _check(await client.call(sid, "shell", {"command": "true"}))
                resumed.append((time.perf_counter() - started) * 1000)
    finally:
        _stop_server(proc)
    added = percentile(resumed, 0.5) - percentile(warm, 0.5)
    verdict = "meets" if added < RESUME_TARGET_MS else "MISSES"
    return [
        Row(
            GROUP,
            "pause -> resume -> first result (shell true)",
            percentile(resumed, 0.5),
            percentile(resumed, 0.95),
            len(resumed),
            note=f"adds {added:.1f} ms over a running session's call (p50); {verdict} the 50 ms target",
        )
    ]


async def _expiry_rows(env: BenchEnv) -> list[Row]:
    dispatcher = ToolDispatcher(FakeSandboxProvider())
    now = [time.time()]
    lifecycle = dispatcher.lifecycle
    lifecycle.clock = lambda: now[0]
    lifecycle._scheduler._clock = lifecycle.clock
    lifecycle.warn_before = 0
    workspace = str(env.workspace("lifecycle-ws"))
    for i in range(EXPIRATIONS):
        dispatcher.sessions.open(
            Session(session_id=f"s{i}", workspace_path=workspace), lifetime=Lifetime(idle_timeout_seconds=60)
        )
    now[0] += 61
    wall, cpu = time.perf_counter(), time.process_time()
    await lifecycle.handle_due(lifecycle._scheduler.due(now[0]))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    expired = sum(
        1 for i in range(EXPIRATIONS) if dispatcher.sessions.status(f"s{i}") is SessionStatus.EXPIRED
    )
    await dispatcher.aclose()
    return [
        Row(
            GROUP,
            f"{EXPIRATIONS:,} idle expirations processed (in-process, in-memory sandbox)",
            wall * 1000,
            n=1,
            note=f"{expired:,} expired; {cpu * 1000:.0f} ms of server CPU ({cpu / EXPIRATIONS * 1e6:.0f} µs each)",
            compare=False,
        )
    ]


async def measure(env: BenchEnv) -> list[Row]:
    return [*(await _expiry_rows(env)), *(await _resume_rows(env))]
