"""The Kubernetes backend against the stand-in API server: what one dispatcher replica holds.

Calls through the attach WebSocket (latency, and calls/s with many sessions at once), a Pod's
launch, and the server's memory per attached session (the RSS growth of the process holding the
provider, over ``sessions`` live Pods each attached by one WebSocket; the stand-in runs in another). The stand-in runs each Pod as a local container, so the
launch time is the stand-in's plus Docker's, not a cluster's (no scheduling, no image pull).

``DISPATCHER_KUBE_BENCH_IMAGE`` names the sandbox image (default: the shared one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import resource
import secrets
import signal
import tempfile
import time
import uuid
from pathlib import Path

import docker

from bench.env import BenchEnv
from bench.grpc_bench import _start_server
from bench.table import Row, row, time_async
from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.sandbox_api import ExecRequest, Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.kubernetes.backend import KubernetesSandboxProvider
from tests.kube_standin import StandIn

GROUP = "kubernetes"
IMAGE = os.environ.get("DISPATCHER_KUBE_BENCH_IMAGE", "dispatcher-sandbox:latest")


def _discard(stream: str, data: bytes) -> None:
    pass


async def _true(sandbox: Sandbox) -> None:
    result = await sandbox.exec(ExecRequest("true", timeout=30), _discard, asyncio.Event())
    if result.exit_code != 0:
        raise RuntimeError(f"true failed: {result}")


def _session(name: str) -> Session:
    sid = f"{name}-{uuid.uuid4().hex[:6]}"
    return Session(sid, f"/nonexistent/{sid}", workspace_root="/nonexistent", workspace_name=sid)


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def _measure(env: BenchEnv, kubeconfig: Path, namespace: str, sessions: int) -> list[Row]:
    config = SandboxConfig(image=IMAGE, max_concurrent_launches=4, mem_limit=64 << 20)
    kube = KubernetesConfig(namespace=namespace, kubeconfig=str(kubeconfig))
    provider = KubernetesSandboxProvider(config, kube, instance=f"bench-{env.run_id}")
    rows: list[Row] = []
    try:
        one = provider.sandbox_for(_session("warm"))
        started = time.perf_counter()
        await _true(one)
        launch_ms = (time.perf_counter() - started) * 1000
        rows.append(row(GROUP, "first call: Pod created, running, attached", [launch_ms]))
        rows.append(
            row(
                "kubernetes",
                "exec `true` over attach",
                await time_async(lambda: _true(one), env.warm_iterations),
            )
        )
        await one.write_bytes("f4k.txt", b"x" * 4096)
        rows.append(
            row(
                "kubernetes",
                "read 4 KiB over attach",
                await time_async(lambda: one.read_bytes("f4k.txt"), env.warm_iterations),
            )
        )
        rss_before = _rss_kib()
        many = [provider.sandbox_for(_session(f"s{i}")) for i in range(sessions)]
        started = time.perf_counter()
        await asyncio.gather(*(_true(s) for s in many))
        launched = time.perf_counter() - started
        rss_after = _rss_kib()
        rounds = 5
        started = time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(_true(s) for s in many))
        elapsed = time.perf_counter() - started
        rate = rounds * sessions / elapsed
        per_session = (rss_after - rss_before) / sessions
        rows.append(
            row(
                "kubernetes",
                f"{sessions} Pods launched at once (4 launch slots)",
                [launched * 1000],
                f"{sessions / launched:.1f} Pods/s",
            )
        )
        rows.append(
            row(
                "kubernetes",
                f"exec `true` x {sessions} sessions at once",
                [elapsed * 1000 / rounds],
                f"{rate:.0f} calls/s; server RSS +{per_session:.0f} KiB per attached session",
            )
        )
    finally:
        await provider.aclose()
    return rows


async def _grpc_rows(env: BenchEnv, kubeconfig: Path, namespace: str, sessions: int) -> list[Row]:
    """The whole path: a ``dispatcher serve`` on the Kubernetes backend, its client here."""
    token = secrets.token_urlsafe(24)
    sandbox = {
        "backend": "kubernetes",
        "image": IMAGE,
        "instance": f"bench-grpc-{env.run_id}",
        "mem_limit": "64m",
        "kubernetes": {"namespace": namespace, "kubeconfig": str(kubeconfig)},
    }
    proc, target = _start_server(env, token, GROUP, {"sandbox": sandbox})
    rows: list[Row] = []
    try:
        async with AsyncDispatcherClient(target, token=token) as client:
            sids = [(await client.create_session(f"b{i}")).session_id for i in range(sessions)]

            async def shell(sid: str) -> None:
                result = await client.call(sid, "shell", {"command": "true"})
                if result.is_error:
                    raise RuntimeError(f"shell failed: {result}")

            await asyncio.gather(*(shell(sid) for sid in sids))  # every Pod up
            rows.append(
                row(
                    GROUP,
                    "shell true via gRPC (warm, one session)",
                    await time_async(lambda: shell(sids[0]), 100),
                )
            )
            rounds = 5
            started = time.perf_counter()
            for _ in range(rounds):
                await asyncio.gather(*(shell(sid) for sid in sids))
            elapsed = time.perf_counter() - started
            rows.append(
                row(
                    GROUP,
                    f"shell true via gRPC x {sessions} sessions at once",
                    [elapsed * 1000 / rounds],
                    f"{rounds * sessions / elapsed:.0f} calls/s through serve",
                )
            )
            for sid in sids:
                await client.close_session(sid)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return rows


def _measure_sync(env: BenchEnv, kubeconfig: Path, namespace: str, sessions: int) -> list[Row]:
    return asyncio.run(_measure(env, kubeconfig, namespace, sessions))


async def measure(env: BenchEnv) -> list[Row]:
    sessions = min(env.concurrency_sessions, 40)
    client = docker.from_env(timeout=60)
    with tempfile.TemporaryDirectory() as tmp:
        standin = StandIn(client, Path(tmp) / "state", instance=f"bench-kube-{env.run_id}").start()
        try:
            standin.create_namespace("bench")
            kubeconfig = standin.kubeconfig(Path(tmp) / "kubeconfig", namespace="bench")
            # The provider in a process of its own, so its RSS is the server's alone (the
            # stand-in's side of every WebSocket stays in this one).
            context = multiprocessing.get_context("spawn")
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
                future = pool.submit(_measure_sync, env, kubeconfig, "bench", sessions)
                rows = await asyncio.wrap_future(future)
            return rows + await _grpc_rows(env, kubeconfig, "bench", min(sessions, 20))
        finally:
            standin.stop()
            standin.runtime.remove_all()  # stop gives up after 60 s; what is left goes here
            client.close()


if __name__ == "__main__":
    import sys

    from bench.table import print_table

    with tempfile.TemporaryDirectory() as scratch:
        found = asyncio.run(measure(BenchEnv(Path(scratch), warm_iterations=200)))
    print_table(found)
    sys.exit(0)
