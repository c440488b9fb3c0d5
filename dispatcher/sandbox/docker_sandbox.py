"""One session's Docker sandbox: the agent channel, with the Docker API as its enforcer.

Calls go to the in-container agent over its attached ``docker exec`` stream. Around every call sits
the enforcement the agent cannot provide for itself: if the channel breaks (the agent died), the
agent raises ``AgentUnresponsive``, or a command outlives timeout + grace + slack, the container is
removed through the Docker API and the next call creates a fresh one. The in-flight exec then
returns with the output it streamed so far and ``killed=True``; a file operation raises
``SandboxError``, which the dispatcher reports as an ``execution_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from dispatcher.core.sandbox_api import (
    DirListing,
    ExecRequest,
    ExecResult,
    FileOpError,
    FileStat,
    OutputCallback,
    SandboxError,
)
from dispatcher.core.session import Session
from dispatcher.sandbox.channel import AgentChannel, AgentUnresponsive
from dispatcher.sandbox.docker_config import WORKSPACE_ROOT
from dispatcher.sandbox.docker_fallback import fallback_exec
from dispatcher.sandbox.docker_stream import AttachStream

if TYPE_CHECKING:
    from dispatcher.sandbox.docker_backend import DockerSandboxProvider

log = logging.getLogger(__name__)
T = TypeVar("T")


class AgentUnavailable(SandboxError):
    """The image cannot run the agent; only exec (through plain docker exec) is available."""


@dataclass(slots=True)
class LiveContainer:
    """A running container and, when its image can run it, the agent attached to it."""

    container_id: str
    stream: AttachStream | None
    channel: AgentChannel | None

    @property
    def broken(self) -> bool:
        if self.channel is not None and self.channel.broken:
            return True
        return self.stream is not None and self.stream.closed


class DockerSandbox:
    """Implements ``dispatcher.core.sandbox_api.Sandbox`` for one session."""

    def __init__(self, provider: DockerSandboxProvider, session: Session) -> None:
        self._provider = provider
        self.session = session
        self._live: LiveContainer | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._active = 0
        self.last_used = time.monotonic()
        self.recreations = 0
        """Containers removed by enforcement or idleness (tests and metrics read it)."""

    @property
    def workspace_root(self) -> str:
        return WORKSPACE_ROOT

    @property
    def container_id(self) -> str | None:
        return self._live.container_id if self._live else None

    # -- lifecycle -----------------------------------------------------------------------

    async def _acquire(self) -> LiveContainer:
        """The live container, created (or recreated) on demand; counts the call as active."""
        self._active += 1
        self.last_used = time.monotonic()
        try:
            async with self._lock:
                if self._closed:
                    # A call that raced CloseSession must not bring a container back to life.
                    raise SandboxError(f"session {self.session.session_id} is closed")
                live = self._live
                if live is not None and live.broken:
                    await self._discard(live, "agent channel closed")
                    live = None
                if live is None:
                    live = self._live = await self._provider.launch(self.session)
                return live
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        self._active -= 1
        self.last_used = time.monotonic()

    async def _discard(self, live: LiveContainer, reason: str) -> None:
        """Forget ``live`` and remove its container, unless a newer one already replaced it."""
        if self._live is not live:
            return
        self._live = None
        self.recreations += 1
        log.warning(
            "removing sandbox container %s of session %s: %s",
            live.container_id[:12],
            self.session.session_id,
            reason,
        )
        await self._provider.destroy(live)

    async def stop_for(self, reason: str) -> None:
        """Remove the running container now (a quota was exceeded); the next call decides anew."""
        async with self._lock:
            if self._live is not None:
                await self._discard(self._live, reason)

    async def enforce(self, live: LiveContainer, reason: str) -> None:
        """Stop the container of a misbehaving sandbox; the next call recreates it."""
        await self._discard(live, reason)

    async def retire_if_idle(self, now: float, ttl: float) -> bool:
        """Remove the container after ``ttl`` seconds without calls; True if it did."""
        if self._live is None or self._active or now - self.last_used < ttl:
            return False
        async with self._lock:
            live = self._live
            if live is None or self._active or now - self.last_used < ttl:
                return False
            await self._discard(live, f"idle for {now - self.last_used:.1f}s")
            self.recreations -= 1  # idleness is not a failure
            return True

    async def close(self) -> None:
        """Remove the container (session closed or server stopping)."""
        async with self._lock:
            self._closed = True
            if self._live is not None:
                live, self._live = self._live, None
                await self._provider.destroy(live)

    # -- exec ----------------------------------------------------------------------------

    async def exec(
        self, request: ExecRequest, on_output: OutputCallback, cancel_event: asyncio.Event
    ) -> ExecResult:
        live = await self._acquire()
        try:
            if live.channel is None:
                return await fallback_exec(
                    self._provider.api,
                    live.container_id,
                    self._provider.config.user_for(self.session.sandbox_uid, self.session.sandbox_gid),
                    request,
                    on_output,
                    cancel_event,
                    lambda reason: self.enforce(live, reason),
                )
            return await self._guarded_exec(live, live.channel, request, on_output, cancel_event)
        finally:
            self._release()

    async def _guarded_exec(
        self,
        live: LiveContainer,
        channel: AgentChannel,
        request: ExecRequest,
        on_output: OutputCallback,
        cancel_event: asyncio.Event,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        slack = self._provider.config.enforce_slack_seconds
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
                    await self.enforce(live, "command outlived its kill sequence")
                    return self._killed(request, cancel_event, started)
            return call.result()
        except AgentUnresponsive as exc:
            await self.enforce(live, f"agent unresponsive: {exc}")
            return self._killed(request, cancel_event, started)
        except SandboxError as exc:
            await self.enforce(live, f"agent channel failed: {exc}")
            raise
        finally:
            cancelled.cancel()
            if not call.done():
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call

    @staticmethod
    def _killed(request: ExecRequest, cancel_event: asyncio.Event, started: float) -> ExecResult:
        elapsed = asyncio.get_running_loop().time() - started
        cancelled = cancel_event.is_set()
        return ExecResult(
            exit_code=None,
            timed_out=not cancelled and elapsed >= request.timeout,
            cancelled=cancelled,
            killed=True,
            duration_ms=elapsed * 1000,
        )

    # -- file operations -----------------------------------------------------------------

    async def _file_op(self, what: str, op: Callable[[AgentChannel], Awaitable[T]]) -> T:
        live = await self._acquire()
        try:
            if live.channel is None:
                raise AgentUnavailable(
                    f"{what}: the sandbox image {self._provider.config.image!r} cannot run the agent"
                    " (file operations need python3 and the agent in the image)"
                )
            try:
                return await asyncio.wait_for(op(live.channel), self._provider.config.op_timeout_seconds)
            except TimeoutError:
                await self.enforce(live, f"{what}: agent did not answer")
                raise SandboxError(f"{what}: the sandbox did not answer; it will be recreated") from None
            except FileOpError as exc:
                note = self._provider.quota_note(self.session.tenant_id) if exc.code == "ENOSPC" else None
                if note is None:
                    raise
                raise FileOpError(exc.code, f"{exc}: {note}") from None
            except SandboxError as exc:
                # A request the agent answered with an error (``internal``) leaves the channel and
                # the session's other calls intact; only a broken channel means a broken agent.
                if live.channel.broken:
                    await self.enforce(live, f"{what}: {exc}")
                raise
        finally:
            self._release()

    async def read_bytes(self, path: str, *, max_bytes: int | None = None) -> bytes:
        return await self._file_op("read", lambda ch: ch.read_bytes(path, max_bytes=max_bytes))

    async def read(self, path: str) -> str:
        return await self._file_op("read", lambda ch: ch.read(path))

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._file_op("write", lambda ch: ch.write_bytes(path, data))

    async def write(self, path: str, content: str) -> None:
        await self._file_op("write", lambda ch: ch.write(path, content))

    async def append(self, path: str, content: str) -> None:
        await self._file_op("append", lambda ch: ch.append(path, content))

    async def exists(self, path: str) -> bool:
        return await self._file_op("exists", lambda ch: ch.exists(path))

    async def stat(self, path: str) -> FileStat:
        return await self._file_op("stat", lambda ch: ch.stat(path))

    async def list(self, path: str, *, limit: int = 1000) -> DirListing:
        return await self._file_op("list", lambda ch: ch.list(path, limit=limit))

    async def delete(self, path: str) -> None:
        await self._file_op("delete", lambda ch: ch.delete(path))

    async def patch(self, path: str, old: str, new: str) -> None:
        await self._file_op("patch", lambda ch: ch.patch(path, old, new))

    async def resolve(self, path: str) -> str:
        return await self._file_op("resolve", lambda ch: ch.resolve(path))
