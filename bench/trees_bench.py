"""Trees in and out (issue 8 point 1): UploadFiles / DownloadFiles of a 2,000-file / 30 MB tree.

A ``dispatcher serve`` subprocess on Docker. The baseline is the host's own ``tar x`` of the same
archive into the same workspace, measured in the same run; the target is an upload within 3x of
it. Each upload goes to a fresh directory (the archive is read into memory first, so the client's
disk is not what is measured); the download is of the uploaded tree, consumed without unpacking.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import subprocess
import tarfile
import time
from pathlib import Path

from bench.env import BenchEnv
from bench.grpc_bench import _docker_answers, _start_server, _stop_server
from bench.table import Row, percentile
from dispatcher.client import AsyncDispatcherClient

GROUP = "trees"
FILES = 2_000
TOTAL = 30_000_000
DIRS = 40
CHUNK = 1 << 20


def _archive() -> bytes:
    """A tar of FILES files in DIRS directories, TOTAL bytes of content (sizes vary 4x)."""
    rng = secrets.SystemRandom()
    weights = [rng.uniform(1, 4) for _ in range(FILES)]
    scale = TOTAL / sum(weights)
    blob = os.urandom(64 << 10)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i, weight in enumerate(weights):
            size = int(weight * scale)
            info = tarfile.TarInfo(f"d{i % DIRS:02d}/f{i:05d}.bin")
            info.size, info.mode, info.mtime = size, 0o644, 1_600_000_000
            data = (blob * (size // len(blob) + 1))[:size]
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _row(name: str, samples: list[float], note: str, compare: bool = False) -> Row:
    return Row(GROUP, name, percentile(samples, 0.5), max(samples), len(samples), note, compare)


async def measure(env: BenchEnv) -> list[Row]:
    """Host ``tar x`` baseline, UploadFiles and DownloadFiles of the same tree, p50 of a few runs."""
    if not _docker_answers():
        return [Row(GROUP, "(skipped)", None, note="needs Docker and the sandbox image")]
    archive = _archive()
    runs = max(3, min(5, env.cold_iterations))
    token = secrets.token_urlsafe(24)
    proc, target = _start_server(env, token, "docker")
    try:
        async with AsyncDispatcherClient(target, token=token, timeout=None) as client:
            session = await client.create_session("trees")
            sid = session.session_id
            workspace = Path(session.workspace_path)
            tar_file = env.scratch / "trees.tar"
            tar_file.write_bytes(archive)
            host: list[float] = []
            for i in range(runs):
                dest = workspace / f"host-{i}"
                dest.mkdir()
                started = time.perf_counter()
                subprocess.run(["tar", "-x", "-f", str(tar_file), "-C", str(dest)], check=True)
                host.append((time.perf_counter() - started) * 1000)
            pieces = [archive[i : i + CHUNK] for i in range(0, len(archive), CHUNK)]
            up: list[float] = []
            for i in range(runs):
                started = time.perf_counter()
                done = await client.upload_tar(sid, pieces, f"up-{i}")
                up.append((time.perf_counter() - started) * 1000)
                if done.files != FILES:
                    raise RuntimeError(f"upload wrote {done.files} files, not {FILES}")
            down: list[float] = []
            for _ in range(runs):
                started = time.perf_counter()
                got = 0
                async for chunk in client.download_tar(sid, "up-0"):
                    got += len(chunk)
                down.append((time.perf_counter() - started) * 1000)
                if got < TOTAL:
                    raise RuntimeError(f"download carried {got} bytes, less than {TOTAL}")
            await client.close_session(sid)
    finally:
        _stop_server(proc)
    mb = len(archive) / 1e6
    base = percentile(host, 0.5)
    tree = f"{FILES:,} files / {TOTAL / 1e6:.0f} MB"
    return [
        _row(f"host tar x of {tree} into the workspace", host, f"{mb / base * 1000:.0f} MB/s; the baseline"),
        _row(
            f"UploadFiles of {tree}",
            up,
            f"{mb / percentile(up, 0.5) * 1000:.0f} MB/s; {percentile(up, 0.5) / base:.1f}x host tar x (target <= 3x)",
        ),
        _row(
            f"DownloadFiles of {tree}",
            down,
            f"{mb / percentile(down, 0.5) * 1000:.0f} MB/s; {percentile(down, 0.5) / base:.1f}x host tar x",
        ),
    ]


if __name__ == "__main__":  # a quick look without the rest of the bench
    import tempfile

    from bench.table import print_table

    with tempfile.TemporaryDirectory(prefix="dispatcher-bench-") as scratch:
        Path(scratch).chmod(0o755)
        print_table(asyncio.run(measure(BenchEnv(Path(scratch)))))
