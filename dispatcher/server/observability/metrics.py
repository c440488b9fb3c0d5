"""Prometheus metrics (``metrics: {listen: HOST:PORT}``): what core, the sandbox backend and the
transport report, served as text at ``/metrics`` from a thread of its own.

Label values come from closed sets only (core/observe.py): registered tool names, outcomes and
failure reasons from enums, tenants from the config, gRPC methods that exist and their status
codes. A request-controlled string never becomes a label, so a client cannot grow the series.
Each server has its own registry, so several servers in one process (tests) do not collide.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

from dispatcher.core.observe import FinishedCall, SandboxFailure, SandboxRemoval
from dispatcher.core.sessions.clock import ExpiryReason
from dispatcher.core.sessions.registry import BaseSessionListener, Restoration, SessionRegistry
from dispatcher.core.sessions.session import SessionStatus
from dispatcher.core.sessions.state import SessionState
from dispatcher.egress.record import Direction, Outcome
from dispatcher.server.requests.handler_wrap import HandlerInterceptor, wrap_handler

__all__ = ["Metrics", "MetricsServer", "RpcMetricsInterceptor"]

log = logging.getLogger("dispatcher.server.observability.metrics")

_PORT_OUTCOMES = frozenset({"closed", "idle", "refused", "failed"})

_CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
_WAIT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_LAUNCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_ADOPT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class Metrics(BaseSessionListener):
    """The dispatcher's metrics in one registry; implements ``CallObserver``, ``SandboxObserver`` and
    ``EgressObserver``, and listens to the session registry (sessions open per tenant)."""

    def __init__(self, tenants: Iterable[str]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.tool_calls = Counter(
            "dispatcher_tool_calls", "Tool calls by outcome", ["tool", "outcome"], registry=r
        )
        self.tool_call_duration = Histogram(
            "dispatcher_tool_call_duration_seconds",
            "From a call's arrival to its result, confirmation waits included",
            ["tool"],
            buckets=_CALL_BUCKETS,
            registry=r,
        )
        self.confirmation_wait = Histogram(
            "dispatcher_confirmation_wait_seconds",
            "How long confirmation requests waited for an answer (or their timeout)",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.sandbox_launch = Histogram(
            "dispatcher_sandbox_launch_seconds",
            "Creating and starting a sandbox until its agent answers",
            buckets=_LAUNCH_BUCKETS,
            registry=r,
        )
        self.sandbox_failures = Counter(
            "dispatcher_sandbox_failures", "Sandboxes that could not be launched", ["reason"], registry=r
        )
        self.sandbox_removals = Counter(
            "dispatcher_sandbox_removals",
            "Running sandboxes removed before their session ended, by why",
            ["reason"],
            registry=r,
        )
        self.pool_takes = Counter(
            "dispatcher_sandbox_pool_takes",
            "Sessions that asked the warm pool for a container, by outcome (hit, miss)",
            ["outcome"],
            registry=r,
        )
        for outcome in ("hit", "miss"):
            self.pool_takes.labels(outcome)
        self.pool_adopt = Histogram(
            "dispatcher_sandbox_pool_adopt_seconds",
            "Adopting a warm pool's container: the workspace mounted and confirmed by its agent",
            buckets=_ADOPT_BUCKETS,
            registry=r,
        )
        self.pool_size = Gauge(
            "dispatcher_sandbox_pool_ready", "Containers waiting in the warm pool", registry=r
        )
        self.rpc_requests = Counter(
            "dispatcher_rpc_requests",
            "gRPC requests by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.sessions_open = Gauge(
            "dispatcher_sessions_open", "Open sessions per tenant", ["tenant"], registry=r
        )
        self.queue_wait = Histogram(
            "dispatcher_dispatch_queue_wait_seconds",
            "How long Dispatch calls waited for one of their tenant's slots (0: none)",
            buckets=(0.0, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.expirations = Counter(
            "dispatcher_session_expirations", "Sessions whose clock ran out, by clock", ["reason"], registry=r
        )
        self.pauses = Counter("dispatcher_session_pauses", "Sessions paused, by why", ["reason"], registry=r)
        self.resumes = Counter(
            "dispatcher_session_resumes", "Sessions resumed, by why", ["reason"], registry=r
        )
        self.sessions_by_state = Gauge(
            "dispatcher_sessions_by_state", "Sessions by state (open, paused, closing)", ["state"], registry=r
        )
        self._tenants = frozenset(tenants)
        for tenant in self._tenants:  # configured tenants only: every series exists from the start
            self.sessions_open.labels(tenant)
        self.egress_connections = Counter(
            "dispatcher_egress_connections",
            "Sandbox connection attempts through the egress proxy, by decision (allowed, refused, failed)",
            ["tenant", "decision"],
            registry=r,
        )
        self.egress_bytes_relayed = Counter(
            "dispatcher_egress_bytes",
            "Bytes relayed by the egress proxy, by direction (out: from the sandbox, in: to it)",
            ["tenant", "direction"],
            registry=r,
        )
        self.preview_connections = Counter(
            "dispatcher_preview_connections",
            "Connections to sandbox ports (ConnectPort), by outcome (closed, idle, refused, failed)",
            ["tenant", "outcome"],
            registry=r,
        )
        self.preview_bytes = Counter(
            "dispatcher_preview_bytes",
            "Bytes carried to and from sandbox ports (in: to the sandbox, out: from it)",
            ["tenant", "direction"],
            registry=r,
        )

        self.tenant_cpu = Gauge(
            "dispatcher_tenant_cpu_percent",
            "CPU its sessions' containers use, summed per tenant (100: one whole CPU), at the last sample",
            ["tenant"],
            registry=r,
        )
        self.tenant_memory = Gauge(
            "dispatcher_tenant_memory_bytes",
            "Memory its sessions' containers use, summed per tenant, at the last sample",
            ["tenant"],
            registry=r,
        )
        self.tenant_disk = Gauge(
            "dispatcher_tenant_workspace_bytes",
            "Its sessions' workspaces on disk, summed per tenant, at the last sample",
            ["tenant"],
            registry=r,
        )
        self.tenant_pids = Gauge(
            "dispatcher_tenant_pids",
            "Processes and threads in its sessions' containers, summed per tenant, at the last sample",
            ["tenant"],
            registry=r,
        )

    def tenant_usage(self, tenant: str, cpu_percent: float, memory: int, disk: int, pids: int) -> None:
        """One sample of a tenant's sessions, summed (no series per session: they come and go)."""
        if tenant not in self._tenants:  # a label comes from a closed set: the configured tenants
            return
        self.tenant_cpu.labels(tenant).set(cpu_percent)
        self.tenant_memory.labels(tenant).set(memory)
        self.tenant_disk.labels(tenant).set(disk)
        self.tenant_pids.labels(tenant).set(pids)

    @property
    def tenants(self) -> frozenset[str]:
        return self._tenants

    # SessionListener: a session counts from its open (or its return after a restart) to its close
    def session_opened(self, state: SessionState) -> None:
        self._count(state, 1)

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        self._count(state, 1)

    def session_closed(self, state: SessionState) -> None:
        self._count(state, -1)

    def _count(self, state: SessionState, delta: int) -> None:
        tenant = state.session.tenant_id
        if tenant in self._tenants:  # a label comes from a closed set: the configured tenants
            self.sessions_open.labels(tenant).inc(delta)

    def watch_states(self, registry: SessionRegistry) -> None:
        """Read the sessions by state from ``registry`` at every scrape."""

        def counter(status: SessionStatus) -> Callable[[], float]:
            return lambda: float(registry.by_status().get(status, 0))

        for status in (SessionStatus.OPEN, SessionStatus.PAUSED, SessionStatus.CLOSING):
            self.sessions_by_state.labels(status.value).set_function(counter(status))

    # LifecycleObserver (label values: the closed set of ExpiryReason)
    def session_expired(self, reason: ExpiryReason) -> None:
        self.expirations.labels(ExpiryReason(reason).value).inc()

    def session_paused(self, reason: ExpiryReason) -> None:
        self.pauses.labels(ExpiryReason(reason).value).inc()

    def session_resumed(self, reason: ExpiryReason) -> None:
        self.resumes.labels(ExpiryReason(reason).value).inc()

    # CallObserver
    def call_finished(self, call: FinishedCall) -> None:
        self.tool_calls.labels(call.tool, call.outcome).inc()
        self.tool_call_duration.labels(call.tool).observe(call.seconds)

    def confirmation_waited(self, seconds: float) -> None:
        self.confirmation_wait.observe(seconds)

    # SandboxObserver
    def sandbox_launched(self, seconds: float) -> None:
        self.sandbox_launch.observe(seconds)

    def sandbox_failed(self, reason: SandboxFailure) -> None:
        self.sandbox_failures.labels(SandboxFailure(reason).value).inc()

    def sandbox_removed(self, reason: SandboxRemoval) -> None:
        self.sandbox_removals.labels(SandboxRemoval(reason).value).inc()

    def pool_taken(self, hit: bool, seconds: float) -> None:
        self.pool_takes.labels("hit" if hit else "miss").inc()
        if hit:
            self.pool_adopt.observe(seconds)

    def pool_ready(self, count: int) -> None:
        self.pool_size.set(count)

    # EgressObserver (labels: configured tenants and the closed sets of dispatcher.egress.record)
    def egress_connection(self, tenant: str, decision: str) -> None:
        self.egress_connections.labels(tenant, Outcome(decision).value).inc()

    def egress_bytes(self, tenant: str, direction: str, count: int) -> None:
        self.egress_bytes_relayed.labels(tenant, Direction(direction).value).inc(count)

    # PortObserver (labels: configured tenants and the closed sets below)
    def port_connection(self, tenant: str, outcome: str) -> None:
        if tenant in self._tenants and outcome in _PORT_OUTCOMES:
            self.preview_connections.labels(tenant, outcome).inc()

    def port_bytes(self, tenant: str, direction: str, count: int) -> None:
        if tenant in self._tenants:
            self.preview_bytes.labels(tenant, Direction(direction).value).inc(count)

    def rpc_finished(self, method: str, code: grpc.StatusCode) -> None:
        self.rpc_requests.labels(method, code.name).inc()


class MetricsServer:
    """The ``/metrics`` HTTP endpoint on its own thread (never on the event loop)."""

    def __init__(self, metrics: Metrics, listen: str) -> None:
        self.metrics = metrics
        self.listen = listen
        self.port = 0
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        host, _, port = self.listen.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        self._server, self._thread = start_http_server(int(port), addr=host, registry=self.metrics.registry)
        self.port = int(self._server.server_address[1])
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class RpcMetricsInterceptor(HandlerInterceptor):
    """Counts each RPC by method and final status code (outermost: refusals count too)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        # Only served methods get here: a name that does not exist is the caller's, never a label.
        method: str = details.method
        done = self.metrics.rpc_finished
        return wrap_handler(handler, around=lambda request, context: _Counted(method, context, done))


Done = Callable[[str, grpc.StatusCode], None]


def _code(context: grpc.aio.ServicerContext, exc: BaseException | None) -> grpc.StatusCode:
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):  # the client went away
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if exc is not None and not isinstance(exc, grpc.aio.AbortError):
        return grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.OK


class _Counted:
    """Around one RPC: counts it with the code it ended with (a plain class: this is on every call)."""

    __slots__ = ("context", "done", "method")

    def __init__(self, method: str, context: grpc.aio.ServicerContext, done: Done) -> None:
        self.method = method
        self.context = context
        self.done = done

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        self.done(self.method, _code(self.context, exc))
