"""One file operation in a container sandbox, with the enforcement the agent cannot provide for itself.

``guarded_file_op`` is ``ContainerSandbox._file_op`` (every ``AgentFiles`` operation), as
``exec_guard.run_command`` is its ``exec``: the operation goes to the agent under the op timeout;
an agent that does not answer, or a channel that breaks, gets the container stopped (``enforce``)
and the next call a fresh sandbox. A request that never reached a live agent (``NotDelivered``) is
sent once more, in that fresh sandbox. ``held_channel`` lends the channel for one long operation
(a tree transfer) under the same rule, without the op timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from dispatcher.core.observe import SandboxRemoval
from dispatcher.core.sandbox_api import FileOpError, SandboxError
from dispatcher.sandbox.channel import AgentChannel, NotDelivered
from dispatcher.sandbox.container.exec_guard import GuardedSandbox
from dispatcher.sandbox.container.host import LiveContainer

T = TypeVar("T")


class AgentUnavailable(SandboxError):
    """The image cannot run the agent; only exec (through its host's ``exec_without_agent``) is
    available."""


async def guarded_file_op(
    sandbox: GuardedSandbox, what: str, op: Callable[[AgentChannel], Awaitable[T]]
) -> T:
    """Run ``op`` on the sandbox's agent channel, guarded; once more if it never reached an agent.

    Raises:
        AgentUnavailable: the image cannot run the agent.
        SandboxError: the agent did not answer or its channel broke (the sandbox is stopped).
        FileOpError: the agent refused the operation (with the tenant's quota named on ENOSPC).
    """
    try:
        return await _file_op_once(sandbox, what, op)
    except NotDelivered:  # never reached a live agent: once more, in the fresh sandbox
        return await _file_op_once(sandbox, what, op)


def _require_agent(sandbox: GuardedSandbox, live: LiveContainer, what: str) -> None:
    if live.channel is None:
        raise AgentUnavailable(
            f"{what}: the sandbox image {sandbox.host.config.image!r} cannot run the agent"
            " (file operations need python3 and the agent in the image)"
        )


async def _file_op_once(sandbox: GuardedSandbox, what: str, op: Callable[[AgentChannel], Awaitable[T]]) -> T:
    async with sandbox.using() as live:
        _require_agent(sandbox, live, what)
        assert live.channel is not None
        try:
            return await asyncio.wait_for(op(live.channel), sandbox.host.config.op_timeout_seconds)
        except TimeoutError:
            await sandbox.enforce(live, f"{what}: agent did not answer")
            raise SandboxError(f"{what}: the sandbox did not answer; it will be recreated") from None
        except FileOpError as exc:
            note = sandbox.host.quota_note(sandbox.session.tenant_id) if exc.code == "ENOSPC" else None
            if note is None:
                raise
            raise FileOpError(exc.code, f"{exc}: {note}") from None
        except SandboxError as exc:
            # A request the agent answered with an error (``internal``) leaves the channel and
            # the session's other calls intact; only a broken channel means a broken agent.
            if live.channel.broken:
                await sandbox.enforce(
                    live,
                    f"{what}: {exc}",
                    tell=not isinstance(exc, NotDelivered),
                    kind=SandboxRemoval.DIED,
                )
            raise


@contextlib.asynccontextmanager
async def held_channel(sandbox: GuardedSandbox, what: str) -> AsyncIterator[AgentChannel]:
    """``ContainerSandbox.agent_channel``: the live channel for one long operation, no op timeout."""
    async with sandbox.using() as live:
        _require_agent(sandbox, live, what)
        assert live.channel is not None
        try:
            yield live.channel
        except SandboxError as exc:
            if live.channel.broken:
                await sandbox.enforce(live, f"{what}: {exc}", kind=SandboxRemoval.DIED)
            raise
