"""What a Docker sandbox needs from the backend that made it: a narrow interface, so the sandbox
(and the re-adoption after a restart) depend on it and not on the whole provider.

``DockerSandboxProvider`` implements ``ContainerHost``; ``LiveContainer`` is what it launches. The
Kubernetes backend implements it too (its "container" is a Pod, its stream the attach WebSocket),
so ``DockerSandbox`` and ``exec_guard`` serve both backends' sessions unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dispatcher.core.observe import SandboxObserver
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.config import SandboxConfig

__all__ = ["AgentStream", "ContainerHost", "LiveContainer"]


class AgentStream(Protocol):
    """The byte stream an agent is attached by (``stream.AttachStream`` on Docker)."""

    @property
    def closed(self) -> bool:
        """The agent's stdout ended (it exited or the connection broke)."""
        ...

    def close(self) -> None: ...

    def stderr_tail(self) -> bytes: ...


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

    @property
    def docker(self) -> DockerAPI | None:
        """The Docker API, for what only Docker does (the docker exec fallback, stdio processes);
        None on another backend."""
        ...

    @property
    def config(self) -> SandboxConfig: ...

    @property
    def observer(self) -> SandboxObserver:
        """Told each removal of a running sandbox (metrics)."""
        ...

    def clock(self) -> float:
        """Now, in monotonic seconds: what containers' ages and idleness are measured on."""
        ...

    async def launch(self, session: Session) -> LiveContainer:
        """A new running container for ``session`` (its agent attached when the image can run it).

        Raises:
            SandboxError: the container could not be created or started.
        """

    async def destroy(self, live: LiveContainer) -> None:
        """Close the agent and remove the container."""

    async def start_agent(
        self, container_id: str, session: Session
    ) -> tuple[AgentStream, AgentChannel] | None:
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
