"""The whole gRPC path on loopback: a ``dispatcher serve`` subprocess and a grpc.aio client here.

Server and client are separate processes, as in production, so each gets its own core of the two.
The sandbox is the Docker backend when a daemon answers (containers carry this run's instance label
and are swept by ``bench.__main__``), else the local backend, which the row notes say.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.env import BenchEnv
from bench.table import Row, percentile, row, time_async
from dispatcher.client import AsyncDispatcherClient
from dispatcher.config import hash_token
from dispatcher.core.types import (
    SideEffect,
    TextBlock,
    ToolContext,
    ToolDefinition,
    ToolOutput,
    ToolResultBlock,
    ToolUseBlock,
)
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc

GROUP = "grpc"
FILE = b"x" * 4095 + b"\n"
READY = re.compile(r"serving on ([0-9.]+:\d+)")
CONCURRENT_CLIENTS = 16


class NoopTool:
    """NONE: returns a constant; measures the service's own overhead per call."""

    definition = ToolDefinition(
        name="noop",
        description="Do nothing and say so.",
        input_schema={"type": "object", "properties": {}},
        side_effect=SideEffect.NONE,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        return ToolOutput([TextBlock("ok")])

    async def cancel(self) -> bool:
        return False


def make_noop_tool() -> NoopTool:
    return NoopTool()


class _FloorServicer(pb_grpc.ToolDispatcherServicer):
    """An empty Dispatch answering like a NONE call: what grpc.aio itself costs.

    The same three messages the dispatcher sends for the NONE tool, field for field (event times,
    session and seq, side effect, the result's text and metadata), built per call as a servicer
    would; only the dispatcher's own work between request and answer is missing.
    """

    def __init__(self) -> None:
        self._seq = 0

    async def Dispatch(self, request: pb.DispatchRequest, context: Any) -> AsyncIterator[pb.DispatchResponse]:
        tid = request.tool_uses[0].id
        sid = request.session_id
        self._seq += 2
        called = pb.ToolCalled(tool_name="noop", side_effect=pb.SIDE_EFFECT_NONE, input_json="{}")
        event = pb.Event(
            seq=self._seq - 1, session_id=sid, tool_use_id=tid, type="tool.called", called=called
        )
        event.time.GetCurrentTime()
        yield pb.DispatchResponse(event=event)
        completed = pb.ToolCompleted(tool_name="noop", duration_ms=0.064)
        event = pb.Event(
            seq=self._seq, session_id=sid, tool_use_id=tid, type="tool.completed", completed=completed
        )
        event.time.GetCurrentTime()
        yield pb.DispatchResponse(event=event)
        result = pb.ToolResult(
            tool_use_id=tid, content=[pb.ContentBlock(text=pb.TextContent(text="ok"))], metadata_json="{}"
        )
        yield pb.DispatchResponse(result=result)


async def _serve_floor() -> None:
    server = grpc.aio.server()
    # The stub marks every rpc abstract; at run time the generated base answers the ones this
    # floor leaves out with UNIMPLEMENTED, which is all it needs.
    pb_grpc.add_ToolDispatcherServicer_to_server(_FloorServicer(), server)  # type: ignore[abstract]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"serving on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    await server.wait_for_termination()


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        try:
            client.ping()
            client.images.get("dispatcher-sandbox:latest")
        finally:
            client.close()
    except Exception:
        return False
    return True


def _start_server(
    env: BenchEnv,
    token: str,
    backend: str,
    extra: dict[str, Any] | None = None,
    sandbox_options: dict[str, Any] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """``dispatcher serve`` with the NONE tool, or (backend "floor") the empty servicer.

    ``extra``: more top-level config keys (the metrics row turns ``metrics:`` on);
    ``sandbox_options``: more ``sandbox:`` keys (the pool row's ``warm_pool``).
    """
    repo = str(Path(__file__).resolve().parents[1])
    if backend == "floor":
        return _spawn([sys.executable, "-m", "bench.grpc_bench", "floor"], repo)
    home = env.workspace("grpc-home")
    sandbox: dict[str, Any] = {"backend": backend}
    if backend == "docker":
        sandbox["instance"] = env.instance
        # An image with this tree's agent, before the shared one is rebuilt (density rows).
        if image := os.environ.get("BENCH_SANDBOX_IMAGE"):
            sandbox["image"] = image
        sandbox.update(sandbox_options or {})
    config = {
        "home": str(home),
        "log": {"format": "json", "level": "warning"},
        "tool_confirmation": {"preset": "autonomous"},
        "sandbox": sandbox,
        "tools": ["bench.grpc_bench:make_noop_tool"],
        "tenants": [
            {
                "id": "bench",
                "token_sha256": hash_token(token),
                "workspace_root": str(home / "ws"),
                # The concurrency row opens one session and one Dispatch per simulated agent at once,
                # while the earlier rows' sessions are still open.
                "quotas": {
                    "max_sessions": 2 * env.concurrency_sessions + 50,
                    "max_concurrent_dispatches": env.concurrency_sessions + 10,
                },
            }
        ],
        **(extra or {}),
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    serve = [
        sys.executable,
        "-m",
        "dispatcher.cli",
        "serve",
        "--config",
        str(path),
        "--listen",
        "127.0.0.1:0",
    ]
    return _spawn(serve, repo)


def _spawn(argv: list[str], repo: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        argv,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": repo},
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        match = READY.search(line)
        if match:
            # Keep reading: a server whose stderr pipe fills up blocks on its next log line.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, match.group(1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{argv[2:4]} did not start: " + "".join(seen[-5:]))


def _stop_server(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _check(result: ToolResultBlock) -> None:
    if result.is_error:
        raise RuntimeError(f"tool call failed: {result}")


async def _throughput(
    target: str, token: str, clients: int, calls_each: int, *, floor: bool = False
) -> tuple[list[float], float]:
    """``clients`` concurrent clients (own channel, own session) making sequential NONE calls."""
    samples: list[float] = []
    warm = 0
    all_warm = asyncio.Event()
    started = 0.0

    async def one() -> None:
        nonlocal warm, started
        async with AsyncDispatcherClient(target, token=token) as client:
            if floor:
                sid = "floor"
            else:
                sid = (await client.create_session(f"noop-{secrets.token_hex(3)}")).session_id
                # Timed on warm sessions: the session's sandbox (started at creation) is up before the
                # clock starts, so no container launch runs during the measured calls.
                _check(await client.call(sid, "shell", {"command": "true"}))
            for _ in range(3):
                _check(await client.call(sid, "noop", {}))
            warm += 1
            if warm == clients:
                started = time.perf_counter()
                all_warm.set()
            await all_warm.wait()
            for _ in range(calls_each):
                began = time.perf_counter()
                _check(await client.call(sid, "noop", {}))
                samples.append((time.perf_counter() - began) * 1000)

    await asyncio.gather(*(one() for _ in range(clients)))
    return samples, len(samples) / (time.perf_counter() - started)


async def measure(env: BenchEnv) -> list[Row]:
    """Warm shell true, 4 KiB read_file, and a NONE tool with 1 and 16 clients, all through gRPC."""
    backend = "docker" if _docker_answers() else "local"
    note = "" if backend == "docker" else "local sandbox: no Docker daemon/image"
    token = secrets.token_urlsafe(24)
    proc, target = _start_server(env, token, backend)
    rows: list[Row] = []
    try:
        async with AsyncDispatcherClient(target, token=token) as client:
            session = await client.create_session("bench")
            sid = session.session_id
            Path(session.workspace_path, "4k.txt").write_bytes(FILE)

            def call(name: str, tool_input: dict[str, Any]) -> Callable[[], Awaitable[None]]:
                async def run() -> None:
                    _check(await client.call(sid, name, tool_input))

                return run

            n = env.warm_iterations
            shell = await time_async(call("shell", {"command": "true"}), n, warmup=5)
            rows.append(row(GROUP, "shell true via gRPC (warm)", shell, note))
            read = await time_async(call("read_file", {"path": "4k.txt"}), n, warmup=5)
            rows.append(row(GROUP, "read_file 4 KiB via gRPC", read, note))
            for label, command, n_cancel in (
                ("cancel -> cancelled result (cooperative)", "echo ready; sleep 100", 10),
                ("cancel -> cancelled result (ignores SIGTERM)", "trap '' TERM; echo ready; sleep 100", 3),
            ):
                samples = [await _cancel_latency(client, sid, command) for _ in range(n_cancel)]
                rows.append(row(GROUP, label, samples, note))

        rows.extend(await _none_rows(env, target, token, "NONE tool via gRPC", floor=False))
        if backend == "docker":
            rows.append(await _concurrency_row(env, target, token))
    finally:
        _stop_server(proc)
    proc, target = _start_server(env, token, "floor")
    try:
        rows.extend(await _none_rows(env, target, token, "grpc.aio floor: empty servicer", floor=True))
    finally:
        _stop_server(proc)
    return rows


async def _cancel_latency(client: AsyncDispatcherClient, sid: str, command: str) -> float:
    """ms from CancelSessionTools to the ``cancelled`` result of a running shell call."""
    cancelled_at = 0.0
    canceller: asyncio.Future[None] | None = None
    async for item in client.dispatch(
        sid, [ToolUseBlock(secrets.token_hex(4), "shell", {"command": command})]
    ):
        if isinstance(item, ToolResultBlock):
            took = (time.perf_counter() - cancelled_at) * 1000
            if canceller is not None:
                await canceller
            if item.error_class is None or item.error_class.value != "cancelled":
                raise RuntimeError(f"expected a cancelled result, got {item}")
            return took
        if item.type == "tool.output_delta" and not cancelled_at:
            cancelled_at = time.perf_counter()
            canceller = asyncio.ensure_future(client.cancel(sid))
    raise RuntimeError("the Dispatch stream ended without a result")


async def _concurrency_row(env: BenchEnv, target: str, token: str) -> Row:
    """design.md §7: 100 sessions x 4 parallel calls, no errors, no leaked containers."""
    sessions = env.concurrency_sessions
    errors: list[str] = []
    latencies: list[float] = []
    created: list[str] = []

    async def one(client: AsyncDispatcherClient, i: int) -> None:
        sid = (await client.create_session(f"conc-{i}")).session_id
        created.append(sid)
        try:
            uses = [
                ToolUseBlock(f"w{i}", "write_file", {"path": "n.txt", "content": str(i)}),
                ToolUseBlock(f"s{i}", "shell", {"command": f"echo {i}"}),
                ToolUseBlock(f"l{i}", "list_dir", {}),
                ToolUseBlock(f"t{i}", "shell", {"command": "true"}),
            ]
            started = time.perf_counter()
            results = [x async for x in client.dispatch(sid, uses) if isinstance(x, ToolResultBlock)]
            latencies.append((time.perf_counter() - started) * 1000)
            if len(results) != 4 or any(r.is_error for r in results):
                errors.append(f"session {i}: {[r.error_class for r in results]}")
        finally:
            await client.close_session(sid)

    started = time.perf_counter()
    async with AsyncDispatcherClient(target, token=token) as client:
        outcomes = await asyncio.gather(*(one(client, i) for i in range(sessions)), return_exceptions=True)
    total = time.perf_counter() - started
    errors += [repr(o) for o in outcomes if isinstance(o, BaseException)]
    leaked = _containers_of(env.instance, set(created))
    note = (
        f"{sessions} sessions x 4 parallel calls in {total:.1f} s; "
        f"{len(errors)} errors; {leaked} containers left after close"
    )
    if errors:
        note += f" (first: {errors[0][:80]})"
    return Row(
        GROUP,
        f"{sessions} new sessions x 4 parallel calls, each",
        percentile(latencies or [0.0], 0.5),
        percentile(latencies or [0.0], 0.95),
        len(latencies),
        note=note,
        compare=False,
    )


def _containers_of(instance: str, sessions: set[str]) -> int:
    """Containers of this instance that belong to one of ``sessions`` (all closed by now)."""
    out = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=dispatcher.instance={instance}",
            "--format",
            '{{.Label "dispatcher.session"}}',
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return sum(1 for sid in out.split() if sid in sessions)


async def _none_rows(env: BenchEnv, target: str, token: str, label: str, *, floor: bool) -> list[Row]:
    rows = []
    for clients in (1, CONCURRENT_CLIENTS):
        calls_each = max(20, env.warm_iterations * 4 // clients)
        samples, rate = await _throughput(target, token, clients, calls_each, floor=floor)
        rows.append(
            Row(
                GROUP,
                f"{label}, {clients} client{'s' if clients > 1 else ''}",
                percentile(samples, 0.5),
                percentile(samples, 0.95),
                len(samples),
                note=f"{rate:,.0f} calls/s" + (" (same 3-message stream, no dispatcher)" if floor else ""),
                compare=False,
            )
        )
    return rows


if __name__ == "__main__" and sys.argv[1:] == ["floor"]:
    asyncio.run(_serve_floor())
