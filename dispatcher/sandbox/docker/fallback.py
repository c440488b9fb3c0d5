"""Commands through plain ``docker exec``, for sandboxes whose image cannot run the agent.

Used when the agent does not start (an image without python3). It costs a Docker API round trip
per command (~50 ms here, versus ~1 ms through the agent) and offers exec only: file operations
need the agent, whose in-container path checks are what keep them inside ``/workspace``.

Process groups: ``docker exec`` makes its process a session leader, so the command's pid is also
its process group id. The wrapper records that pid in a file under ``/tmp`` (the sandbox may
tamper with it, but the kill runs as the sandbox user, so at worst it signals its own processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from dispatcher.core.paths import resolve_workspace_path
from dispatcher.core.sandbox_api import ExecRequest, ExecResult, OutputCallback
from dispatcher.sandbox.container.config import WORKSPACE_ROOT
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.stream import AttachStream, open_attach_stream

# $1 pid file, $2 working directory, $3 the command. `exec` keeps the recorded pid the command's.
_WRAPPER = 'echo $$ >"$1" || exit 125; cd -- "$2" || exit 126; exec sh -c "$3"'
_CHUNK = 64 << 10
_KILL_SETTLE_SECONDS = 1.0

Enforce = Callable[[str], Awaitable[None]]
"""Stops the container; called when signals did not end the command."""


async def fallback_exec(
    api: DockerAPI,
    container_id: str,
    user: str,
    request: ExecRequest,
    on_output: OutputCallback,
    cancel_event: asyncio.Event,
    enforce: Enforce,
) -> ExecResult:
    """Run ``request`` with ``docker exec``; same kill sequence and result flags as the agent."""
    started = time.monotonic()
    cwd = resolve_workspace_path(request.cwd or ".", WORKSPACE_ROOT)
    pidfile = posixpath.join("/tmp", f".dispatcher-exec-{uuid.uuid4().hex}")
    exec_id = await api.exec_create(
        container_id,
        ["sh", "-c", _WRAPPER, "dispatcher-exec", pidfile, cwd, request.command],
        stdin=request.stdin is not None,
        stdout=True,
        stderr=True,
        tty=False,
        user=user,
        environment=dict(request.env),
        workdir=WORKSPACE_ROOT,
    )
    sock, leftover = await api.exec_attach(exec_id)

    def on_stderr(chunk: bytes) -> None:
        on_output("stderr", chunk)  # not paced: docker's attach stream has no way to wait

    stream = await open_attach_stream(sock, leftover, exec_id, on_stderr=on_stderr)
    try:
        if request.stdin is not None:
            stream.writer.write(request.stdin)
            await stream.writer.drain()
            if stream.writer.can_write_eof():
                stream.writer.write_eof()
        pump = asyncio.ensure_future(_pump_stdout(stream, on_output))
        outcome = await _wait(pump, request, cancel_event)
        killed = enforced = False
        if outcome != "exited":
            killed = await _kill_group(api, container_id, user, pidfile, pump, request.grace_seconds)
            if not pump.done():
                enforced = True
                pump.cancel()
                await enforce(f"command outlived SIGKILL ({outcome})")
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await pump
        code = None if enforced else await _exit_code(api, exec_id)
    finally:
        stream.close()
    return _result(code, outcome, killed, started)


async def _pump_stdout(stream: AttachStream, on_output: OutputCallback) -> None:
    while chunk := await stream.reader.read(_CHUNK):
        on_output("stdout", chunk)


async def _wait(pump: asyncio.Future[None], request: ExecRequest, cancel_event: asyncio.Event) -> str:
    """'exited', 'timeout' or 'cancelled', whichever comes first."""
    cancelled: asyncio.Future[Any] = asyncio.ensure_future(cancel_event.wait())
    try:
        waiters: set[asyncio.Future[Any]] = {pump, cancelled}
        done, _ = await asyncio.wait(waiters, timeout=request.timeout, return_when="FIRST_COMPLETED")
    finally:
        cancelled.cancel()
    if pump in done:
        return "exited"
    return "cancelled" if cancel_event.is_set() else "timeout"


async def _kill_group(
    api: DockerAPI, container_id: str, user: str, pidfile: str, pump: asyncio.Future[None], grace: float
) -> bool:
    """SIGTERM the group, wait ``grace``, then SIGKILL; True if SIGKILL was sent."""
    for sig, wait in (("TERM", grace), ("KILL", _KILL_SETTLE_SECONDS)):
        script = f'pid=$(cat "$1" 2>/dev/null) && kill -{sig} -- "-$pid" 2>/dev/null'
        with contextlib.suppress(Exception):
            await api.exec_run(container_id, ["sh", "-c", script, "kill", pidfile], user=user)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, ConnectionError):
            await asyncio.wait_for(asyncio.shield(pump), timeout=wait)
        if pump.done():
            return sig == "KILL"
    return True


async def _exit_code(api: DockerAPI, exec_id: str) -> int | None:
    # The stream can end a moment before the daemon records the exit code.
    deadline = time.monotonic() + 2.0
    while True:
        info = await api.exec_inspect(exec_id)
        if not info.get("Running") or time.monotonic() > deadline:
            code = info.get("ExitCode")
            return int(code) if code is not None else None
        await asyncio.sleep(0.01)


def _result(code: int | None, outcome: str, killed: bool, started: float) -> ExecResult:
    signal: int | None = None
    if code is not None and code > 128 and outcome != "exited":
        signal, code = code - 128, None
    return ExecResult(
        exit_code=code,
        signal=signal,
        timed_out=outcome == "timeout",
        cancelled=outcome == "cancelled",
        killed=killed,
        duration_ms=(time.monotonic() - started) * 1000,
    )
