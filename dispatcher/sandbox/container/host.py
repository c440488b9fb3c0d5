"""What a container sandbox needs from the host that runs its container: a narrow interface, so the
sandbox (and the re-adoption after a restart) depend on it and not on the whole provider.

Both hosts implement ``ContainerHost``: the Docker one (a container, its stream a ``docker exec``
or the agent's socket) and the Kubernetes one (a Pod, its stream the attach WebSocket), so one
``ContainerSandbox`` with its guards serves both backends' sessions. ``LiveContainer`` is what a
host launches. What only one host can do (a command without the agent, a process with its stdio
attached) is declared here too, and refused by a host that cannot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from dispatcher.core.observe import SandboxObserver
from dispatcher.core.sandbox_api import (
    AttachedProcess,
    ExecRequest,
    ExecResult,
    OutputCallback,
    SandboxError,
)
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import SandboxConfig

__all__ = ["AgentLink", "AgentStream", "ContainerHost", "ContainerNotFound", "LiveContainer"]


class ContainerNotFound(SandboxError, LookupError):
    """The container (or Pod) is gone."""


class AgentStream(Protocol):
    """The byte stream an agent is attached by (``stream.AttachStream`` on Docker)."""

    @property
    def closed(self) -> bool:
        """The agent's stdout ended (it exited or the connection broke)."""
        ...

    def close(self) -> None: ...

    def stderr_tail(self) -> bytes: ...


AgentLink = tuple[AgentStream, AgentChannel]
"""An agent attached: its byte stream and the channel spoken over it."""


@dataclass(slots=True)
class LiveContainer:
    """A running container and, when its image can run it, the agent attached to it."""

    container_id: str
    stream: AgentStream | None
    channel: AgentChannel | None
    started: float
    """When the container started (on its host's ``clock``), for ``sandbox.max_lifetime_seconds``."""

    def older_than(self, seconds: float | None, now: float) -> bool:
        return seconds is not None and now - self.started >= seconds

    @property
    def broken(self) -> bool:
        if self.channel is not None and self.channel.broken:
            return True
        return self.stream is not None and self.stream.closed


class ContainerHost(Protocol):
    """Launches and removes a session's containers and is told when its container changes."""

    config: SandboxConfig
    observer: SandboxObserver
    """Told each removal of a running sandbox (metrics)."""

    def clock(self) -> float:
        """Now, in monotonic seconds: what containers' ages and idleness are measured on."""
        ...

    def adoption_slot(self) -> AbstractAsyncContextManager[None]:
        """One of the host's slots for a call starting an agent in a container kept across a
        restart, held for the block (the background sweep has its own, ``adopt_all``)."""
        ...

    async def launch(self, session: Session) -> LiveContainer:
        """A new running container for ``session`` (its agent attached when the image can run it).

        Raises:
            SandboxError: the container could not be created or started.
        """

    async def destroy(self, live: LiveContainer) -> None:
        """Close the agent and remove the container."""

    async def start_agent(self, container_id: str, session: Session) -> AgentLink | None:
        """A fresh agent in a running container; None when the image cannot run it.

        Raises:
            SandboxError: the agent started but did not answer its first ping.
        """

    async def freeze(self, container_id: str) -> None:
        """Freeze the container's processes (a paused session)."""

    async def thaw(self, container_id: str) -> None:
        """Thaw them.

        Raises:
            ContainerNotFound: the container is gone.
        """

    async def is_running(self, container_id: str) -> bool:
        """Whether the container still runs, asked after its agent's channel failed."""
        ...

    async def remove_container(self, container_id: str) -> None:
        """Remove a container that is no live sandbox's (a failed re-adoption)."""

    def container_changed(self, session_id: str, container_id: str | None) -> None:
        """The session's container is now ``container_id`` (None: it has none)."""

    def quota_note(self, tenant_id: str) -> str | None:
        """What to tell a model about the tenant's disk quota, if anything."""

    async def exec_without_agent(
        self,
        live: LiveContainer,
        session: Session,
        request: ExecRequest,
        on_output: OutputCallback,
        cancel_event: asyncio.Event,
        enforce: Callable[[str], Awaitable[None]],
    ) -> ExecResult:
        """Run a command in a container whose image cannot run the agent (Docker: one plain
        ``docker exec``); ``enforce`` stops the container when signals did not end it.

        Raises:
            SandboxError: this host runs no command without the agent.
        """
        ...

    async def start_process(
        self,
        live: LiveContainer,
        session: Session,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        limit: int,
    ) -> AttachedProcess:
        """A long-running process in the container, its stdin/stdout attached (``Sandbox.start_process``).

        Raises:
            SandboxError: it could not be started, or this host cannot attach one.
        """
        ...
