"""How a container sandbox's process ops reach its agent (``processes.control.ProcessHost``).

As a file operation (``file_guard.py``): the op goes to the agent under the op timeout, plus
the wait or grace it asks for itself; an agent that does not answer, or a channel that breaks,
gets the container stopped (``enforce``), and a request that never reached a live agent
(``NotDelivered``) is sent once more. Unlike a file operation, nothing but a start launches a
container: a session without a running one has no processes. A paused session's container is
frozen and would not answer (a wait would end in the container's removal): its short ops are
refused with ``SessionPaused``; the server resumes a session before a call reaches here, as it
does for exec.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeVar

from dispatcher.core.observe import SandboxRemoval
from dispatcher.core.process_api import ProcessError
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.channel import AgentChannel, NotDelivered
from dispatcher.sandbox.container.exec_guard import GuardedSandbox
from dispatcher.sandbox.container.host import LiveContainer

T = TypeVar("T")


class SessionPaused(SandboxError):
    """The session is paused: its sandbox is frozen and answers nothing until it is resumed."""


class ProcessSandbox(GuardedSandbox, Protocol):
    """What the process ops need of a container sandbox (``ContainerSandbox``)."""

    generation: int
    last_removal: str | None

    @property
    def paused(self) -> bool: ...

    def using_running(self) -> AbstractAsyncContextManager[LiveContainer | None]: ...

    async def thawed(self) -> None: ...


class ContainerProcessHost:
    """``ProcessHost`` for a container sandbox."""

    def __init__(self, sandbox: ProcessSandbox) -> None:
        self._sandbox = sandbox

    @property
    def generation(self) -> int:
        return self._sandbox.generation

    @property
    def last_removal(self) -> str | None:
        return self._sandbox.last_removal

    async def thawed(self) -> None:
        await self._sandbox.thawed()

    async def process_op(
        self, what: str, op: Callable[[AgentChannel], Awaitable[T]], *, launch: bool, extra_seconds: float
    ) -> T | None:
        """See ``ProcessHost.process_op``.

        Raises:
            SessionPaused: the session is paused.
            ProcessError: ``unsupported``: the image cannot run the agent.
            SandboxError: the agent did not answer or its channel broke (the sandbox is stopped).
        """
        try:
            return await self._once(what, op, launch, extra_seconds)
        except NotDelivered:  # never reached a live agent: once more (in a fresh sandbox to start)
            return await self._once(what, op, launch, extra_seconds)

    async def _once(
        self, what: str, op: Callable[[AgentChannel], Awaitable[T]], launch: bool, extra_seconds: float
    ) -> T | None:
        sandbox = self._sandbox
        if sandbox.paused:
            raise SessionPaused(
                f"{what}: the session is paused, its processes frozen; resume it (a call resumes it)"
                " to reach them"
            )
        using = sandbox.using() if launch else sandbox.using_running()
        async with using as live:
            if live is None:
                return None
            channel = _channel(sandbox, live)
            timeout = sandbox.host.config.op_timeout_seconds + extra_seconds
            try:
                return await asyncio.wait_for(op(channel), timeout)
            except TimeoutError:
                await sandbox.enforce(live, f"{what}: agent did not answer")
                raise SandboxError(f"{what}: the sandbox did not answer; it will be recreated") from None
            except SandboxError as exc:
                if channel.broken:
                    await sandbox.enforce(
                        live,
                        f"{what}: {exc}",
                        tell=not isinstance(exc, NotDelivered),
                        kind=SandboxRemoval.DIED,
                    )
                raise

    async def process_channel(self) -> AgentChannel | None:
        """See ``ProcessHost.process_channel``."""
        sandbox = self._sandbox
        async with sandbox.using_running() as live:
            return None if live is None else _channel(sandbox, live)


def _channel(sandbox: ProcessSandbox, live: LiveContainer) -> AgentChannel:
    if live.channel is None:
        raise ProcessError(
            "unsupported",
            f"the sandbox image {sandbox.host.config.image!r} cannot run the agent, which keeps the"
            " session's background processes; run commands in the foreground (shell) instead",
        )
    return live.channel
