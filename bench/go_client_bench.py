"""Shell ``true`` and a 4 KiB read_file through gRPC from a Go client, next to the Python client.

Issue 23's goal for shell ``true`` is "<= 2 ms p50 with a Go client": this measures that figure with
the client of ``bench/go_client`` (built offline by ``scripts/build_go_client.sh``), against the same
``dispatcher serve`` subprocess and session workspace the Python client is measured on in the same
run, so the two differ only by the client. Each Go sample is one Dispatch with one tool_use, timed
inside the Go process from the call to the end of its stream. The sandbox is Docker when a daemon
answers, as in ``bench.grpc_bench``. Two more rows put both clients against grpc_bench's empty
servicer, which shows how much of a call is the client and how much the dispatcher.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

from bench.env import BenchEnv
from bench.grpc_bench import FILE, _check, _docker_answers, _start_server, _stop_server
from bench.table import Row, percentile, row, time_async
from dispatcher.client import AsyncDispatcherClient

GROUP = "grpc"
REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "scripts" / "build_go_client.sh"
WORKSPACE = "go-bench"
WARMUP = 5
FIGURES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("shell true via gRPC", "shell", {"command": "true"}),
    ("read_file 4 KiB via gRPC", "read_file", {"path": "4k.txt"}),
)


class GoClientUnavailable(Exception):
    """The Go toolchain is missing and could not be installed."""


async def build_go_client() -> Path:
    """The built client's path; installs the Debian toolchain first if it is missing (root only)."""
    proc = await asyncio.create_subprocess_exec(
        "bash", str(BUILD), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode == 3:  # the script's "no toolchain" exit
        raise GoClientUnavailable(err.decode(errors="replace").strip().splitlines()[-1])
    if proc.returncode != 0:
        raise RuntimeError(f"{BUILD.name} failed: {err.decode(errors='replace')[-800:]}")
    return Path(out.decode().strip().splitlines()[-1])


async def run_go_client(
    binary: Path,
    target: str,
    token: str,
    tool: str,
    tool_input: dict[str, Any],
    n: int,
    warmup: int,
    session: str = "",
) -> list[float]:
    """Latencies in ms of ``n`` sequential calls by the Go client (in a session of its own unless given)."""
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        f"-target={target}",
        f"-workspace={WORKSPACE}",
        f"-session={session}",
        f"-tool={tool}",
        f"-input={json.dumps(tool_input)}",
        f"-n={n}",
        f"-warmup={warmup}",
        # The token goes by environment, not argv, which other users of the host can read.
        env={"DISPATCHER_TOKEN": token},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"go client ({tool}) failed: {err.decode(errors='replace')[-800:]}")
    samples = [float(s) for s in json.loads(out)["samples_ms"]]
    if len(samples) != n:
        raise RuntimeError(f"go client returned {len(samples)} samples, expected {n}")
    return samples


async def measure(env: BenchEnv) -> list[Row]:
    """Per figure: the Python client, then the Go client, on one server and one workspace."""
    try:
        binary = await build_go_client()
    except GoClientUnavailable as exc:
        return [
            Row(
                GROUP,
                "shell true via gRPC, Go client",
                None,
                note=f"not measured: {exc}; then: python3 -m bench --only go_client_bench",
                compare=False,
            )
        ]
    backend = "docker" if _docker_answers() else "local"
    where = "" if backend == "docker" else "; local sandbox: no Docker daemon/image"
    token = secrets.token_urlsafe(24)
    proc, target = _start_server(env, token, backend)
    rows: list[Row] = []
    try:
        async with AsyncDispatcherClient(target, token=token) as client:
            session = await client.create_session(WORKSPACE)
            sid = session.session_id
            # The Go client's sessions open the same workspace, so they read this file too.
            Path(session.workspace_path, "4k.txt").write_bytes(FILE)
            n = env.warm_iterations
            for label, tool, tool_input in FIGURES:

                async def call(tool: str = tool, tool_input: dict[str, Any] = tool_input) -> None:
                    _check(await client.call(sid, tool, tool_input))

                # Two halves in opposite order, so drift in the machine's load favours neither client.
                py: list[float] = []
                go: list[float] = []
                for half, python_first in ((n - n // 2, True), (n // 2, False)):
                    if python_first:
                        py += await time_async(call, half, warmup=WARMUP)
                    go += await run_go_client(binary, target, token, tool, tool_input, half, WARMUP)
                    if not python_first:
                        py += await time_async(call, half, warmup=WARMUP)
                rows.append(row(GROUP, f"{label}, Python client", py, f"grpc.aio, same server as Go{where}"))
                rows.append(row(GROUP, f"{label}, Go client", go, f"grpc-go (bench/go_client){where}"))
            await client.close_session(sid)
    finally:
        _stop_server(proc)
    rows.extend(await _floor_rows(env, binary, token))
    return rows


async def _floor_rows(env: BenchEnv, binary: Path, token: str) -> list[Row]:
    """Both clients against grpc_bench's empty servicer: what each client and grpc itself cost."""
    proc, target = _start_server(env, token, "floor")
    try:
        async with AsyncDispatcherClient(target, token=token) as client:

            async def call() -> None:
                _check(await client.call("floor", "noop", {}))

            py = await time_async(call, env.warm_iterations, warmup=WARMUP)
        go = await run_go_client(binary, target, token, "noop", {}, env.warm_iterations, WARMUP, "floor")
    finally:
        _stop_server(proc)
    note = "empty servicer, same 3-message stream, no dispatcher"
    return [
        Row(GROUP, "grpc floor, Python client", *_stats(py), note=note, compare=False),
        Row(GROUP, "grpc floor, Go client", *_stats(go), note=note, compare=False),
    ]


def _stats(samples: list[float]) -> tuple[float, float, int]:
    return percentile(samples, 0.5), percentile(samples, 0.95), len(samples)
