"""Assembles the service: dispatcher + sandbox provider + tenants + grpc.aio server, and its shutdown.

The parts made from the config alone are in ``parts.py``, the grpc.aio server itself in
``rpc/grpc_server.py``, and what a restart gives back before serving in ``restore.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Callable
from typing import Protocol

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from dispatcher.config.load import Config
from dispatcher.core.audit import AuditLog
from dispatcher.core.errors import ConfigError
from dispatcher.core.provider_api import ProviderHooks
from dispatcher.core.registry import ToolRegistry
from dispatcher.core.sessions.clock import Lifetime, OnExpire
from dispatcher.core.sessions.expiry import LifecycleHooks
from dispatcher.mcp.servers import McpServers
from dispatcher.server.config_check import check_served_config, check_tool_names
from dispatcher.server.config_check import load_tool_factory as load_tool_factory
from dispatcher.server.egress_wiring import egress_gateway
from dispatcher.server.observability.setup import Observability
from dispatcher.server.parts import ProviderFactory as ProviderFactory
from dispatcher.server.parts import build_dispatcher as build_dispatcher
from dispatcher.server.parts import default_ids, tree_transfers
from dispatcher.server.parts import make_provider as make_provider
from dispatcher.server.persistence.home_lock import HomeLock
from dispatcher.server.persistence.state import IN_MEMORY, Persistence, SessionPersistence
from dispatcher.server.preview.gateway import Gateway
from dispatcher.server.preview.opening import Previews
from dispatcher.server.preview.ports import OpenPorts
from dispatcher.server.requests.errors import Unauthenticated
from dispatcher.server.restore import restore_sessions
from dispatcher.server.rpc.decode import DecodeGuardInterceptor
from dispatcher.server.rpc.grpc_server import SERVICE_NAME as SERVICE_NAME
from dispatcher.server.rpc.grpc_server import grpc_server, server_credentials
from dispatcher.server.rpc.servicer import DispatcherServicer
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.sessions.snapshots import Snapshots
from dispatcher.server.sessions.usage import TenantUsage, UsageReader
from dispatcher.server.tenancy.auth import AuthInterceptor
from dispatcher.server.tenancy.tenants import TenantDirectory
from dispatcher.server.tenancy.uids import UIDS_FILE

log = logging.getLogger("dispatcher.server")

CANCEL_AHEAD_OF_GRACE = 1.0
"""Seconds before the shutdown grace ends at which still-running tools are cancelled."""
FINAL_GRACE = 0.5
"""What the transport gives the calls still open after the grace (unary calls, the last results)."""


def build_server(config: Config, provider: ProviderFactory | None = None) -> DispatcherServer:
    """The whole service for ``config`` (tenants must already be resolved), not yet started;
    ``provider`` makes its sandbox backend (default: ``make_provider``, as the config asks).

    Call it inside the event loop that will run the server: grpc.aio binds to the running loop.

    Raises:
        ConfigError: a custom tool or the sandbox section is invalid.
        StateError: another server holds the home, or its ``state.db`` is unusable.
    """
    # The config's tools are registered, and the keys naming them checked, before the home is
    # locked: a bad config fails before anything is written there.
    registry = ToolRegistry()
    check_served_config(config, registry)
    return DispatcherServer(config, provider or functools.partial(make_provider, config), registry)


class ServedEndpoint(Protocol):
    """What the server keeps of its MCP endpoint (which it imports only to start it)."""

    port: int

    def sessions_of(self, tenant: str) -> int: ...

    async def aclose(self) -> None: ...


class DispatcherServer:
    """The running service: one grpc.aio server plus what it serves. The only global state."""

    def __init__(self, config: Config, provider_factory: ProviderFactory, registry: ToolRegistry) -> None:
        """``registry``: the config's tools, registered and checked (``check_served_config``)."""
        self.config = config
        self.observability = Observability(config)
        # The home first: a second server on it must fail before it writes anything there
        # (the tenants' uids below are allocated into <home>/uids.json).
        self._home_lock = HomeLock(config.home)
        self._home_lock.acquire()
        self.persistence: Persistence = IN_MEMORY
        try:
            self._build(config, provider_factory, registry)
        except BaseException:
            self._close_state()
            raise

    def _build(self, config: Config, provider_factory: ProviderFactory, registry: ToolRegistry) -> None:
        """Each part made with what it needs, in the order they need each other: nothing is
        handed to a part after it was made."""
        self.tenants = TenantDirectory(
            config.tenants,
            config.policy,
            uid_range=config.tenant_uids,
            uid_file=config.home / UIDS_FILE,
            default_ids=default_ids(config),
        )
        # The home is locked: its state.db is this server's (a damaged one fails the build).
        self.persistence = SessionPersistence.open(config.home, config.dispatcher)
        audit = AuditLog(str(config.audit_log)) if config.audit_log is not None else None
        self.egress = egress_gateway(
            config, audit, self.tenants, self.observability, bound_port=lambda: self.port
        )
        self.provider = provider = provider_factory(
            ProviderHooks(
                observer=self.observability.sandbox_observer,
                on_container=self.persistence.container_changed,  # stored: a restart re-adopts it
                egress=self.egress,  # each sandbox's agent hands its proxy connections to it
            )
        )
        metrics = self.observability.metrics
        life = config.sessions
        self.dispatcher = dispatcher = build_dispatcher(
            config,
            provider,
            audit=audit,
            observer=self.observability.calls,
            lifecycle=LifecycleHooks(
                warn_before=life.expiring_notice_seconds,
                observer=metrics,
                on_change=self.persistence.clock_changed,
            ),
            registry=registry,
        )
        self.mcp = McpServers(config.mcp_servers, provider=provider, home=config.home)
        # The preview gateway's open ports: kept in state.db, closed with their session (a
        # listener, below).
        self.previews = (
            Previews(OpenPorts(keeper=self.persistence), config.preview) if config.preview.listen else None
        )
        # Told of each session in this order (closed in the reverse): stored, its egress state,
        # its sandbox started or re-adopted, its MCP processes, counted.
        self.sessions = SessionManager(
            dispatcher,
            persistence=self.persistence,
            listeners=(
                self.egress,
                provider,
                self.mcp,
                *((self.previews.ports,) if self.previews is not None else ()),
                *self.observability.session_listeners,
            ),
            lifetime=Lifetime(life.ttl_seconds, life.idle_timeout_seconds, OnExpire(life.on_expire)),
            queue_observer=metrics.queue_wait.observe if metrics is not None else None,
            sandbox_ids=provider,
        )
        if metrics is not None:
            metrics.watch_states(dispatcher.sessions)
        self.usage = UsageReader(self.sessions, provider, self.egress.traffic)
        self.snapshots = Snapshots(self.sessions, provider, self.persistence.store, config.home / "snapshots")
        self.health = health_aio.HealthServicer()
        self._server = grpc_server(
            config.server,
            # Metrics and traces outermost: refused requests count too.
            interceptors=[
                *self.observability.interceptors,
                AuthInterceptor(self.tenants),
                DecodeGuardInterceptor(),
            ],
            servicer=DispatcherServicer(
                self.sessions,
                transfers=tree_transfers(dispatcher, config.server),
                usage=self.usage,
                snapshots=self.snapshots,
                port_observer=metrics,
                previews=self.previews,
            ),
            health=self.health,
        )
        self.gateway = (
            Gateway(
                self.sessions,
                self.previews.ports,
                config.preview.domain,
                self.tenants.get,
                observer=metrics,
                max_body_bytes=config.preview.max_body_bytes,
            )
            if self.previews is not None
            else None
        )
        self.port = 0
        self.mcp_endpoint: ServedEndpoint | None = None
        self._stopped = False
        self._adopting: asyncio.Task[None] | None = None
        self._sampling: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """(The home is locked since the server was built.) Bind, seal the tool registry, give back the stored sessions and start
        serving; returns the bound port.

        Raises:
            ConfigError: the listen address cannot be bound.
            StateError: another server holds the home, or its ``state.db`` is unusable.
        """
        try:
            return await self._start()
        except BaseException:
            self.observability.stop()
            self._close_state()
            raise

    async def _start(self) -> int:
        try:
            tls = self.config.tls
            if tls is None:
                self.port = self._server.add_insecure_port(self.config.listen)
            else:
                self.port = self._server.add_secure_port(self.config.listen, server_credentials(tls))
        except RuntimeError as exc:
            raise ConfigError(f"listen: cannot bind {self.config.listen}: {exc}") from exc
        if self.port == 0:
            raise ConfigError(f"listen: cannot bind {self.config.listen}")
        await self.mcp.register(self.dispatcher)  # MCP servers' tools, before the seal
        # Now that the MCP servers listed theirs, every tool name in the config is checked exactly.
        problems = check_tool_names(self.config, self.dispatcher.registry.list(), mcp_pending=False)
        if problems:
            raise ConfigError("\n".join(problems))
        self.dispatcher.seal()
        await self.provider.check_ready()  # fail at start, clearly, not on the first tool call
        # Disk quotas, before CreateSession makes any workspace.
        await self.provider.prepare_tenants({t.tenant_id: str(t.workspace_root) for t in self.config.tenants})
        # Who the sandboxes of each will run as (a warm pool makes containers for them).
        ids = (self.tenants.get(t.tenant_id) for t in self.config.tenants)
        self.provider.expect_tenants({t.tenant_id: (t.uid, t.gid) for t in ids})
        restore_sessions(  # after the quota volumes are mounted: workspaces live there
            self.persistence,
            self.sessions,
            self.tenants,
            self.dispatcher.sessions,
            self.previews,
            self.config.preview.allow_public,
        )
        await asyncio.to_thread(self.snapshots.load)  # interrupted copies removed
        await self.provider.remove_orphans()  # containers left by a previous run, but those re-adopted
        # Re-attach the agents in the background; a first call waits for its own.
        self._adopting = asyncio.create_task(self.provider.adopt_all(), name="adopt-containers")
        self.observability.start()
        self._start_usage_sampler()
        self.dispatcher.lifecycle.start()  # the overdue among the sessions given back expire now
        await self._server.start()
        if self.gateway is not None and self.previews is not None:
            listen = self.config.preview.listen or ""
            host, _, port = listen.rpartition(":")
            try:
                self.previews.listen_port = await self.gateway.start(host.strip("[]"), int(port))
            except OSError as exc:
                raise ConfigError(f"preview.listen: cannot bind {listen}: {exc}") from exc
            log.info("preview gateway", extra={"listen": listen, "port": self.previews.listen_port})
        await self._start_mcp_endpoint()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", extra={"listen": self.config.listen, "port": self.port})
        return self.port

    def _start_usage_sampler(self) -> None:
        """With metrics on: every tenant's sessions' usage summed into its gauges, periodically."""
        metrics = self.observability.metrics
        if metrics is None:
            return

        def report(tenant: str, used: TenantUsage) -> None:
            metrics.tenant_usage(tenant, used.cpu_percent, used.memory_bytes, used.disk_bytes, used.pids)

        self._sampling = asyncio.create_task(
            self.usage.sample_forever(sorted(metrics.tenants), report), name="usage-sampler"
        )

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, refuse new work, give in-flight calls ``grace`` seconds,
        cancel the rest, then stop every session's sandbox."""
        if self._stopped:
            return
        grace = self.config.server.grace_seconds if grace is None else grace
        log.info("shutting down", extra={"grace_seconds": grace})
        await self.health.enter_graceful_shutdown()
        # The grace is run here rather than by grpc's stop(grace): while it lasts the server still
        # answers, so new calls get UNAVAILABLE from the servicer instead of being cut by the transport.
        self.sessions.start_draining()
        await self.dispatcher.lifecycle.aclose()  # no session expires while the server stops
        ahead = min(CANCEL_AHEAD_OF_GRACE, grace / 2)
        if not await self.sessions.wait_idle(grace - ahead):
            # Cancel what still runs, so its Dispatch streams can deliver `cancelled` results (with
            # partial output) before the calls are cut.
            cancelling = asyncio.create_task(self.sessions.cancel_all())
            await self.sessions.wait_idle(ahead)
            cancelling.cancel()
        if self.mcp_endpoint is not None:
            # After the drain (its calls finish like any client's), before the gRPC side stops:
            # the MCP sessions' dispatcher sessions are closed through it.
            await self.mcp_endpoint.aclose()
        await self._server.stop(FINAL_GRACE)
        if self.gateway is not None:
            await self.gateway.stop()
        for task in (self._adopting, self._sampling):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        keep = not self.config.shutdown_remove_sessions
        if keep:
            self.persistence.save_policies(self.dispatcher.sessions)
        await self.sessions.aclose(keep_sessions=keep)
        if keep:  # the containers stay for the next start to re-adopt
            await self.provider.detach_all()
        await self.dispatcher.aclose(keep_sessions=keep)
        await self.mcp.aclose()
        await self.observability.aclose()
        self._close_state()  # commits the queued events, then lets the next server in
        self._stopped = True
        log.info("stopped")

    async def _start_mcp_endpoint(self) -> None:
        """Serve ``mcp_endpoint`` (MCP's streamable HTTP): a gateway that is a gRPC client of this
        server, with each request's own token (dispatcher/mcp_server/http.py).

        Raises:
            ConfigError: its listen address cannot be bound.
        """
        settings = self.config.mcp_endpoint
        if settings is None:
            return
        # The one upward import of the server: the gateway is a client of it, not a part of it.
        from dispatcher.mcp_server.http import McpEndpoint, grpc_target

        def tenant_of(authorization: str | None) -> str | None:
            try:
                return self.tenants.authenticate(authorization).tenant_id
            except Unauthenticated:
                return None

        # A request as large as the gRPC side takes: a tool input fits in either.
        endpoint = McpEndpoint(
            settings,
            grpc_target(self.config.listen, self.port),
            tenant_of,
            max_body_bytes=self.config.server.max_request_bytes,
        )
        try:
            port = await endpoint.start()
        except OSError as exc:
            raise ConfigError(f"mcp_endpoint.listen: cannot bind {settings.listen}: {exc}") from exc
        self.mcp_endpoint = endpoint
        log.info("serving MCP", extra={"listen": settings.listen, "port": port, "path": settings.path})

    def _close_state(self) -> None:
        self.persistence.close()
        self.persistence = IN_MEMORY
        self._home_lock.release()


async def serve_until_signalled(
    server: DispatcherServer, on_ready: Callable[[int], None] | None = None
) -> None:
    """Start, run until SIGTERM or SIGINT, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    port = await server.start()
    if on_ready is not None:
        on_ready(port)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await server.stop()
