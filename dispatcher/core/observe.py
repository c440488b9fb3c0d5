"""What the dispatcher reports for monitoring: interfaces core and the sandbox backends call,
implemented by the server (Prometheus metrics, OpenTelemetry traces), so that neither core nor
sandbox imports a monitoring library. The defaults do nothing.

Every value here that may become a metric label comes from a closed set: a tool name is a
registered tool's (``UNKNOWN_TOOL`` otherwise), an outcome is ``"ok"`` or a ``ToolErrorClass``
value, a sandbox failure a ``SandboxFailure``. A request-controlled string never is one.

``log_context`` carries the ids of what the current task is doing (tenant, session, tool_use_id,
tool, trace id) to every log line written meanwhile, whichever logger writes it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Protocol

__all__ = [
    "NO_OBSERVER",
    "NO_SANDBOX_OBSERVER",
    "UNKNOWN_TOOL",
    "CallObserver",
    "FinishedCall",
    "SandboxFailure",
    "SandboxObserver",
    "log_context",
    "log_fields",
]

UNKNOWN_TOOL: Final = "_unknown"
"""The tool a call names when no registered tool has that name (the name itself is the caller's)."""


@dataclass(frozen=True, slots=True)
class FinishedCall:
    """One tool call that has ended, however it ended."""

    tenant: str
    session_id: str
    tool_use_id: str
    tool: str
    """A registered tool's name, or ``UNKNOWN_TOOL``."""
    outcome: str
    """``"ok"`` or a ``ToolErrorClass`` value."""
    started: float
    """Wall-clock time (``time.time()``) when the call arrived."""
    seconds: float
    """From arrival to result, confirmation waits included."""
    ran: bool
    """Whether the tool started (false: refused before it ran)."""


class CallObserver(Protocol):
    """Told about each call as it ends; must not block or raise."""

    def call_finished(self, call: FinishedCall) -> None: ...

    def confirmation_waited(self, seconds: float) -> None: ...


class SandboxFailure(enum.StrEnum):
    """Why a sandbox could not be launched."""

    IMAGE = "image"  # the image is missing or unusable
    AGENT_VERSION = "agent_version"  # the image's agent speaks another protocol version
    LAUNCH = "launch"  # the container or its agent did not start (after the retry)


class SandboxRemoval(enum.StrEnum):
    """Why a running sandbox was removed before its session ended."""

    ENFORCED = "enforced"  # a command outlived its kill sequence, or the agent stopped answering
    DIED = "died"  # its container or its agent died by itself (a fork bomb under gVisor, OOM)
    PROCESS_LIMIT = "process_limit"  # its pids limit stayed exhausted after the leftovers were killed
    QUOTA = "quota"  # its tenant went over its disk quota (watched usage)
    IDLE = "idle"  # unused for sandbox.idle_ttl_seconds
    LIFETIME = "lifetime"  # older than sandbox.max_lifetime_seconds


class SandboxObserver(Protocol):
    """Told about sandbox launches and removals by a backend; must not block or raise."""

    def sandbox_launched(self, seconds: float) -> None: ...

    def sandbox_failed(self, reason: SandboxFailure) -> None: ...

    def sandbox_removed(self, reason: SandboxRemoval) -> None: ...

    def pool_taken(self, hit: bool, seconds: float) -> None:
        """A session asked the warm pool: ``hit`` and the adoption's duration, or a miss (0)."""
        ...

    def pool_ready(self, count: int) -> None:
        """Containers waiting in the warm pool now."""
        ...


class _Nothing:
    def call_finished(self, call: FinishedCall) -> None:
        pass

    def confirmation_waited(self, seconds: float) -> None:
        pass

    def sandbox_launched(self, seconds: float) -> None:
        pass

    def sandbox_failed(self, reason: SandboxFailure) -> None:
        pass

    def sandbox_removed(self, reason: SandboxRemoval) -> None:
        pass

    def pool_taken(self, hit: bool, seconds: float) -> None:
        pass

    def pool_ready(self, count: int) -> None:
        pass


NO_OBSERVER: Final[CallObserver] = _Nothing()
NO_SANDBOX_OBSERVER: Final[SandboxObserver] = _Nothing()

_NO_FIELDS: Final[Mapping[str, str]] = MappingProxyType({})
log_context: ContextVar[Mapping[str, str]] = ContextVar("dispatcher_log_context", default=_NO_FIELDS)


class log_fields:
    """Add ``fields`` to every log line written in this context (tasks started in it included).

    A class rather than a generator-based context manager: every tool call enters one."""

    __slots__ = ("_fields", "_token")

    def __init__(self, **fields: str) -> None:
        self._fields = fields

    def __enter__(self) -> None:
        self._token = log_context.set({**log_context.get(), **self._fields})

    def __exit__(self, *exc_info: object) -> None:
        log_context.reset(self._token)
