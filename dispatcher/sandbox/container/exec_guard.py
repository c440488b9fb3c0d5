"""One command in a container sandbox, with the enforcement the agent cannot provide for itself.

``run_command`` is ``ContainerSandbox.exec``: the command goes to the agent (or, for an image that
cannot run it, to its host's ``exec_without_agent``: plain ``docker exec``), in a fresh sandbox once more when the first never
answered (the container died, the agent was already gone), after killing the leftovers or in a
fresh sandbox when the pids limit is exhausted. The agent runs a command's SIGTERM, grace, SIGKILL sequence. These functions only act when it failed
to: a command that outlives timeout + grace + slack (or cancel + grace + slack), an agent that stops
answering, or a channel that breaks. Then the container is stopped (``enforce``) and the command
returns what it streamed so far with ``killed=True``. A channel that broke because the container
died raises ``ContainerDied``; leftover processes that fill the pids limit are killed by
``kill_leftovers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

from dispatcher.core.observe import SandboxRemoval
from dispatcher.core.sandbox_api import (
    ExecRequest,
    ExecResult,
    FileOpError,
    OutputCallback,
    ProcessLimitExhausted,
    SandboxError,
    report_notice,
)
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.channel import AgentChannel, AgentUnresponsive, NotDelivered
from dispatcher.sandbox.container.host import ContainerHost, LiveContainer

log = logging.getLogger(__name__)

Enforce = Callable[[str, bool, SandboxRemoval], Awaitable[None]]
"""Stop the container for a reason; the flag: tell the next call's result (a notice)."""


class ContainerDied(SandboxError):
    """The container stopped under a command that had not answered at all (no output, no exit)."""


class GuardedSandbox(Protocol):
    """What ``run_command`` needs of a session's container sandbox (``ContainerSandbox``)."""

    session: Session

    @property
    def host(self) -> ContainerHost: ...

    def using(self) -> AbstractAsyncContextManager[LiveContainer]: ...

    async def enforce(
        self, live: LiveContainer, reason: str, *, tell: bool = True, kind: SandboxRemoval = ...
    ) -> None: ...


async def run_command(
    sandbox: GuardedSandbox, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
) -> ExecResult:
    """``Sandbox.exec`` for a container sandbox.

    Raises:
        ProcessLimitExhausted: the pids limit stayed exhausted, even in a fresh sandbox.
        SandboxError: the sandbox failed twice.
    """
    config = sandbox.host.config
    limit = config.pids_limit
    answered = False

    def relay(stream: Literal["stdout", "stderr"], data: bytes) -> asyncio.Future[None] | None:
        nonlocal answered
        answered = True
        return on_output(stream, data)

    for attempt in range(3):
        async with sandbox.using() as live:
            if live.channel is None:  # an image that cannot run the agent: its host's way, if any
                return await sandbox.host.exec_without_agent(
                    live,
                    sandbox.session,
                    request,
                    on_output,
                    cancel_event,
                    functools.partial(sandbox.enforce, live),
                )

            async def enforce(
                reason: str, tell: bool, kind: SandboxRemoval, live: LiveContainer = live
            ) -> None:
                await sandbox.enforce(live, reason, tell=tell, kind=kind)

            try:
                return await guarded_exec(
                    live.channel,
                    request,
                    relay,
                    cancel_event,
                    slack=config.enforce_slack_seconds,
                    enforce=enforce,
                    running=functools.partial(sandbox.host.is_running, live.container_id),
                )
            except ContainerDied:
                if attempt or answered:
                    raise
                # gVisor's sandbox can die of a fork bomb just after that bomb's call returned,
                # under the next command. Its sandbox is gone whatever it did: once more.
                report_notice(
                    "the sandbox's container died before this command answered anything; it ran"
                    " once more in a fresh sandbox (any effect it had on the workspace before"
                    " may have happened twice)"
                )
            except NotDelivered:
                if attempt:
                    raise
                # The agent was dead before the command went out: nothing of it ran, so it
                # runs in the fresh sandbox (already discarded by guarded_exec).
            except ProcessLimitExhausted as exc:
                if attempt == 0 and await kill_leftovers(
                    live.channel,
                    exc.processes,
                    timeout=config.op_timeout_seconds,
                    pids_limit=limit,
                    session_id=sandbox.session.session_id,
                ):
                    continue
                if attempt < 2:
                    await sandbox.enforce(
                        live,
                        f"its process limit ({limit}) stayed exhausted",
                        tell=False,
                        kind=SandboxRemoval.PROCESS_LIMIT,
                    )
                    continue
                raise ProcessLimitExhausted(
                    f"cannot start the command: the sandbox's process limit ({limit}) is exhausted"
                    f" ({exc.processes} processes left running by earlier commands), even in a fresh"
                    " sandbox",
                    processes=exc.processes,
                ) from None
    raise AssertionError("unreachable")


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
                await enforce("command outlived its kill sequence", True, SandboxRemoval.ENFORCED)
                return killed_result(request, cancel_event, started)
        return call.result()
    except AgentUnresponsive as exc:
        await enforce(f"agent unresponsive: {exc}", True, SandboxRemoval.ENFORCED)
        return killed_result(request, cancel_event, started)
    except SandboxError as exc:
        died = not isinstance(exc, NotDelivered) and not await running()
        await enforce(f"agent channel failed: {exc}", not isinstance(exc, NotDelivered), SandboxRemoval.DIED)
        if died:
            raise ContainerDied(f"the sandbox's container stopped: {exc}") from exc
        raise
    finally:
        cancelled.cancel()
        if not call.done():
            call.cancel()
            with contextlib.suppress(BaseException):
                await call


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
