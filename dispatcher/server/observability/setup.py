"""Metrics and traces of one server, as its config asks: the observer handed to core, the one
handed to the sandbox backend, the gRPC interceptors, and the ``/metrics`` endpoint's lifetime."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

from dispatcher.config.load import Config
from dispatcher.core.errors import ConfigError
from dispatcher.core.observe import NO_OBSERVER, CallObserver, FinishedCall
from dispatcher.core.sandbox_api import SandboxProvider
from dispatcher.core.session_registry import SessionListener

if TYPE_CHECKING:  # imported for real only when turned on: prometheus_client, the otel extra
    from dispatcher.server.observability.metrics import Metrics, MetricsServer
    from dispatcher.server.observability.tracing import Tracing

__all__ = ["Observability"]

log = logging.getLogger("dispatcher.server")


class _Both:
    """Tells several observers (metrics and traces) in turn."""

    def __init__(self, observers: Sequence[CallObserver]) -> None:
        self.observers = tuple(observers)

    def call_finished(self, call: FinishedCall) -> None:
        for o in self.observers:
            o.call_finished(call)

    def confirmation_waited(self, seconds: float) -> None:
        for o in self.observers:
            o.confirmation_waited(seconds)


class Observability:
    """What ``metrics:`` and ``tracing:`` turn on; nothing at all when both are off."""

    def __init__(self, config: Config) -> None:
        self.metrics: Metrics | None = None
        self.tracing: Tracing | None = None
        self.server: MetricsServer | None = None
        observers: list[CallObserver] = []
        interceptors: list[grpc.aio.ServerInterceptor] = []
        listen = config.observe.metrics_listen
        if listen is not None:
            from dispatcher.server.observability.metrics import Metrics, MetricsServer, RpcMetricsInterceptor

            self.metrics = Metrics(t.tenant_id for t in config.tenants)
            self.server = MetricsServer(self.metrics, listen)
            observers.append(self.metrics)
            interceptors.append(RpcMetricsInterceptor(self.metrics))
        if config.observe.otlp_endpoint is not None:
            from dispatcher.server.observability.tracing import Tracing

            self.tracing = Tracing.otlp(config.observe.otlp_endpoint)
            observers.append(self.tracing)
            interceptors.append(self.tracing.interceptor())
        self.calls: CallObserver = (
            NO_OBSERVER if not observers else observers[0] if len(observers) == 1 else _Both(observers)
        )
        self.interceptors = tuple(interceptors)

    @property
    def metrics_port(self) -> int:
        return 0 if self.server is None else self.server.port

    def attach_sandbox(self, provider: SandboxProvider) -> None:
        """Give the sandbox backend its launch/failure observer."""
        if self.metrics is not None:
            provider.observer = self.metrics

    @property
    def session_listeners(self) -> tuple[SessionListener, ...]:
        """What counts sessions (the metrics, when on), for the session registry."""
        return () if self.metrics is None else (self.metrics,)

    def start(self) -> None:
        """Serve ``/metrics`` (on its own thread).

        Raises:
            ConfigError: the metrics address cannot be bound.
        """
        if self.server is None:
            return
        try:
            port = self.server.start()
        except OSError as exc:
            raise ConfigError(
                f"metrics.listen: cannot bind {self.server.listen}: {exc.strerror or exc}"
            ) from exc
        log.info("metrics served", extra={"listen": self.server.listen, "port": port})

    async def aclose(self) -> None:
        """``stop`` off the event loop: the HTTP server takes up to its poll interval (0.5 s) to
        stop, and the span exporter flushes what is pending."""
        await asyncio.to_thread(self.stop)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.tracing is not None:
            self.tracing.shutdown()
