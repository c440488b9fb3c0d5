"""The enforcement around one command in a Docker sandbox: what the agent cannot do for itself.

The agent runs a command's SIGTERM, grace, SIGKILL sequence. These functions only act when it failed
to: a command that outlives timeout + grace + slack (or cancel + grace + slack), an agent that stops
answering, or a channel that breaks. Then the container is stopped (``enforce``) and the command
returns what it streamed so far with ``killed=True``. A channel that broke because the container
died raises ``ContainerDied``; leftover processes that fill the pids limit are killed by
``kill_leftovers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dispatcher.core.sandbox_api import (
    ExecRequest,
    ExecResult,
    FileOpError,
    OutputCallback,
    SandboxError,
    report_notice,
)
from dispatcher.sandbox.channel import AgentChannel, AgentUnresponsive, NotDelivered
from dispatcher.sandbox.docker.client import DockerAPI

log = logging.getLogger(__name__)

Enforce = Callable[[str, bool], Awaitable[None]]
"""Stop the container for a reason; the flag: tell the next call's result (a notice)."""


class ContainerDied(SandboxError):
    """The container stopped under a command that had not answered at all (no output, no exit)."""


async def guarded_exec(
    channel: AgentChannel,
    request: ExecRequest,
    on_output: OutputCallback,
    cancel_event: asyncio.Event,
    *,
    slack: float,
    enforce: Enforce,
    running: Callable[[], Awaitable[bool]],
) -> ExecResult:
    """Run ``request`` through the agent, stopping the container when the agent's own kill
    sequence did not end it in time.

    Raises:
        ContainerDied: the channel broke because the container stopped.
        SandboxError: the channel broke otherwise (``NotDelivered``: nothing of it ran).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    # The agent runs the SIGTERM/grace/SIGKILL sequence itself; this deadline only fires when
    # it failed to (hung agent, or a group that survived SIGKILL without the agent noticing).
    deadline = started + request.timeout + request.grace_seconds + slack
    call = asyncio.ensure_future(channel.exec(request, on_output, cancel_event))
    cancelled = asyncio.ensure_future(cancel_event.wait())
    try:
        while not call.done():
            waiters: set[asyncio.Future[Any]] = {call}
            if not cancelled.done():
                waiters.add(cancelled)
            await asyncio.wait(
                waiters, timeout=max(0.0, deadline - loop.time()), return_when="FIRST_COMPLETED"
            )
            if call.done():
                break
            if cancelled.done() and deadline > loop.time() + request.grace_seconds + slack:
                deadline = loop.time() + request.grace_seconds + slack
                continue
            if loop.time() >= deadline:
                call.cancel()
                await enforce("command outlived its kill sequence", True)
                return killed_result(request, cancel_event, started)
        return call.result()
    except AgentUnresponsive as exc:
        await enforce(f"agent unresponsive: {exc}", True)
        return killed_result(request, cancel_event, started)
    except SandboxError as exc:
        died = not isinstance(exc, NotDelivered) and not await running()
        await enforce(f"agent channel failed: {exc}", not isinstance(exc, NotDelivered))
        if died:
            raise ContainerDied(f"the sandbox's container stopped: {exc}") from exc
        raise
    finally:
        cancelled.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(BaseException):
                await call


async def still_running(api: DockerAPI, container_id: str, settle: float = 5.0) -> bool:
    """Whether Docker still runs the container, asked only after a channel failed; the channel's
    end can come before Docker has noticed the death, so it is given ``settle`` s."""
    deadline = time.monotonic() + settle
    while True:
        try:
            info = await api.inspect(container_id)
        except SandboxError:
            return False
        if not (info.get("State") or {}).get("Running"):
            return False
        if time.monotonic() >= deadline:
            return True
        await asyncio.sleep(0.05)


def killed_result(request: ExecRequest, cancel_event: asyncio.Event, started: float) -> ExecResult:
    """The result of a command whose container was stopped under it."""
    elapsed = asyncio.get_running_loop().time() - started
    cancelled = cancel_event.is_set()
    return ExecResult(
        exit_code=None,
        timed_out=not cancelled and elapsed >= request.timeout,
        cancelled=cancelled,
        killed=True,
        duration_ms=elapsed * 1000,
    )


async def kill_leftovers(
    channel: AgentChannel, processes: int, *, timeout: float, pids_limit: int, session_id: str
) -> bool:
    """Kill every process commands left behind (a fork bomb) so the next command can start; the
    call's result is told. False: the agent could not do it."""
    try:
        _, killed, left = await asyncio.wait_for(channel.procs(kill=True), timeout)
    except (TimeoutError, SandboxError, FileOpError) as exc:
        log.warning("session %s: killing leftover processes failed: %s", session_id, exc)
        return False
    log.warning("session %s: process limit exhausted, killed %d processes", session_id, killed)
    what = (
        f"they were killed ({killed} processes, background commands included)"
        if killed
        else "they had ended by the time they were to be killed"
    )
    report_notice(
        f"the sandbox's process limit ({pids_limit}) was exhausted by"
        f" {processes} leftover processes; {what}" + (f"; {left} remain" if left else "")
    )
    return True
