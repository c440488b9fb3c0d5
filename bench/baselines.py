"""The Docker API figures the fast path is compared with, measured on a sandbox-like container."""

from __future__ import annotations

import asyncio
import io
import subprocess
import tarfile
import time
from collections.abc import Callable

import docker

from bench.env import BenchEnv
from bench.table import BASELINE, Row, row
from dispatcher.sandbox.docker.config import DEFAULT_IMAGE

FILE_BYTES = 4096


def time_sync(fn: Callable[[], object], n: int, *, warmup: int = 2) -> list[float]:
    """Latencies in ms of ``n`` sequential calls after ``warmup`` unmeasured ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
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


async def measure(env: BenchEnv) -> list[Row]:
    """Docker exec, archive and run baselines (blocking SDK calls, run in a thread)."""
    return await asyncio.to_thread(_measure, env)
