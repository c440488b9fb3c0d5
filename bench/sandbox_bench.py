"""The fast path: commands and file operations through the in-container agent."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any

import docker

from bench.baselines import time_sync
from bench.env import BenchEnv
from bench.table import IDLE_GAP_SECONDS, Row, row, time_async
from dispatcher.core.sandbox_api import ExecRequest, Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import Tool, ToolContext
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.tools import ReadFileTool, ShellTool, WriteFileTool

FILE = b"x" * 4095 + b"\n"
BIG_OUTPUT = 100 << 20


def _discard(stream: str, data: bytes) -> None:
    pass


def _context(sandbox: Sandbox, workspace: str) -> ToolContext:
    return ToolContext(
        session_id="bench",
        turn_id="bench",
        tool_use_id="bench",
        workspace_path=workspace,
        cancel_event=asyncio.Event(),
        logger=logging.LoggerAdapter(logging.getLogger("bench"), {}),
        workspace_files=sandbox,
        sandbox=sandbox,
        emit_output=lambda stream, text: None,
    )


def _session(env: BenchEnv, name: str) -> Session:
    sid = f"{name}-{uuid.uuid4().hex[:6]}"
    workspace = env.workspace(sid)
    uid, gid = SandboxConfig().uid, SandboxConfig().gid
    if os.geteuid() == 0 and uid is not None:
        # The server never re-owns a directory it did not make; a workspace made by hand belongs
        # to the sandbox user, as a developer's would.
        os.chown(workspace, uid, gid if gid is not None else -1)
    return Session(session_id=sid, workspace_path=str(workspace))


async def _exec_true(sandbox: Sandbox) -> None:
    result = await sandbox.exec(ExecRequest("true", timeout=30), _discard, asyncio.Event())
    if result.exit_code != 0:
        raise RuntimeError(f"true failed: {result}")


async def _cold(env: BenchEnv, provider: DockerSandboxProvider, name: str) -> list[float]:
    samples = []
    for _ in range(env.cold_iterations):
        session = _session(env, name)
        started = time.perf_counter()
        await _exec_true(provider.sandbox_for(session))
        samples.append((time.perf_counter() - started) * 1000)
        await provider.close_session(session.session_id)
    return samples


THINK_SECONDS = 1.0
"""How long a model takes to send its first tool call after the session is made (a low guess)."""


async def _started_on_create(env: BenchEnv) -> list[float]:
    """New session → first result when ``start_on_create`` started the container meanwhile."""
    provider = DockerSandboxProvider(SandboxConfig(start_on_create=True), instance=env.instance)
    samples = []
    try:
        for _ in range(env.cold_iterations):
            session = _session(env, "on-create")
            provider.session_created(session)
            await asyncio.sleep(THINK_SECONDS)
            started = time.perf_counter()
            await _exec_true(provider.sandbox_for(session))
            samples.append((time.perf_counter() - started) * 1000)
            await provider.close_session(session.session_id)
    finally:
        await provider.aclose()
    return samples


async def _tool(tool: type[Tool], context: ToolContext, **input: Any) -> None:
    await tool().execute(input, context)


async def _runc_rows(env: BenchEnv) -> list[Row]:
    provider = DockerSandboxProvider(SandboxConfig(), instance=env.instance)
    try:
        session = _session(env, "warm")
        sandbox = provider.sandbox_for(session)
        context = _context(sandbox, session.workspace_path)
        await sandbox.write_bytes("f4k.txt", FILE)
        n = env.warm_iterations
        rows = [
            row("sandbox", "exec `true` (sandbox API)", await time_async(lambda: _exec_true(sandbox), n)),
            row(
                "sandbox",
                'shell {"command":"true"} (tool)',
                await time_async(lambda: _tool(ShellTool, context, command="true"), n),
            ),
            row(
                "sandbox",
                "read 4 KiB (sandbox API)",
                await time_async(lambda: sandbox.read_bytes("f4k.txt"), n),
            ),
            row(
                "sandbox",
                "read_file 4 KiB (tool)",
                await time_async(lambda: _tool(ReadFileTool, context, path="f4k.txt"), n),
            ),
            row(
                "sandbox",
                f"exec `true` (sandbox API), {IDLE_GAP_SECONDS * 1000:g} ms idle before each",
                await time_async(lambda: _exec_true(sandbox), n, gap=IDLE_GAP_SECONDS),
                "at a call cadence: the agent and the server wake for each call",
            ),
            row(
                "sandbox",
                f"read 4 KiB (sandbox API), {IDLE_GAP_SECONDS * 1000:g} ms idle before each",
                await time_async(lambda: sandbox.read_bytes("f4k.txt"), n, gap=IDLE_GAP_SECONDS),
                "at a call cadence: the agent and the server wake for each call",
            ),
            row(
                "sandbox",
                "write 4 KiB (sandbox API)",
                await time_async(lambda: sandbox.write_bytes("w4k.txt", FILE), n),
                "atomic: temp + fsync + rename",
            ),
            row(
                "sandbox",
                "write_file 4 KiB (tool)",
                await time_async(
                    lambda: _tool(WriteFileTool, context, path="w4k.txt", content=FILE.decode()), n
                ),
            ),
        ]
        started = time.perf_counter()
        await sandbox.exec(
            ExecRequest(f"head -c {BIG_OUTPUT} /dev/zero", timeout=120), _discard, asyncio.Event()
        )
        seconds = time.perf_counter() - started
        rows.append(
            Row(
                "sandbox",
                "100 MiB of output streamed (total)",
                seconds * 1000,
                n=1,
                note=f"{100 / seconds:.0f} MiB/s",
                compare=False,
            )
        )
        rows.append(
            row("sandbox", "new session → first result (cold)", await _cold(env, provider, "cold"), "runc")
        )
        rows.append(
            row(
                "sandbox",
                f"new session → first result, start_on_create, call {THINK_SECONDS:g} s later",
                await _started_on_create(env),
                "the container was started at creation",
            )
        )
        return rows
    finally:
        await provider.aclose()


async def _runsc_rows(env: BenchEnv) -> list[Row]:
    client = docker.from_env()
    try:
        available = "runsc" in (client.info().get("Runtimes") or {})
    finally:
        client.close()
    if not available:
        return [Row("runsc", "exec `true` under runsc", None, note="runsc not registered: skipped")]
    provider = DockerSandboxProvider(SandboxConfig(runtime="runsc", pids_limit=256), instance=env.instance)
    try:
        sandbox = provider.sandbox_for(_session(env, "runsc"))
        warm = await time_async(lambda: _exec_true(sandbox), max(env.warm_iterations // 3, 20))
        container_id = sandbox.container_id
        assert container_id is not None
        docker_exec = await asyncio.to_thread(_docker_exec_samples, container_id, env.docker_iterations)
        return [
            row("runsc", "docker exec true under runsc (API)", docker_exec),
            row("runsc", "exec `true` under runsc (sandbox API)", warm),
            row(
                "runsc", "new session → first result (cold, runsc)", await _cold(env, provider, "runsc-cold")
            ),
        ]
    finally:
        await provider.aclose()


def _docker_exec_samples(container_id: str, n: int) -> list[float]:
    client = docker.from_env()
    try:

        def exec_true() -> None:
            exec_id = client.api.exec_create(container_id, ["true"])["Id"]
            client.api.exec_start(exec_id)

        return time_sync(exec_true, n)
    finally:
        client.close()


async def measure(env: BenchEnv) -> list[Row]:
    """Warm exec/read/write through the agent, big output, cold start; the same under runsc."""
    return [*await _runc_rows(env), *await _runsc_rows(env)]
