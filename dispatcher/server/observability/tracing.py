"""OpenTelemetry traces (``tracing: {otlp_endpoint: ...}``, the ``otel`` extra): one span per
Dispatch RPC, continuing the caller's trace from its ``traceparent`` metadata, and one child span
per tool call, with tenant, session, tool and outcome as attributes.

Imported only when tracing is configured (the config check names the missing extra otherwise).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dispatcher.core.observe import FinishedCall, log_fields
from dispatcher.server.requests.handler_wrap import HandlerInterceptor, wrap_handler
from dispatcher.server.tenancy.auth import current_tenant

__all__ = ["Tracing"]

DISPATCH_METHOD = "/dispatcher.v1.ToolDispatcher/Dispatch"
_ATTRIBUTE_CHARS = 256  # a session id is the caller's: bounded like the servicer bounds it
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """Spans of one server; implements ``CallObserver`` (tool calls) and makes the RPC interceptor."""

    def __init__(self, processor: SpanProcessor) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": "dispatcher"}))
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("dispatcher")

    @classmethod
    def otlp(cls, endpoint: str) -> Tracing:
        """Export in batches over OTLP/gRPC (plaintext for an ``http://`` endpoint)."""
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
        return cls(BatchSpanProcessor(exporter))

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _TracingInterceptor(self)

    def shutdown(self) -> None:
        """Flush what is pending and stop exporting."""
        self.provider.shutdown()

    # CallObserver: the span is made when the call ends, with the time it arrived as its start; it
    # is a child of the Dispatch span, which is current in the call's task.
    def call_finished(self, call: FinishedCall) -> None:
        span = self.tracer.start_span(
            "tool_call",
            kind=SpanKind.INTERNAL,
            start_time=int(call.started * 1e9),
            attributes={
                "dispatcher.tenant": call.tenant,
                "dispatcher.session": call.session_id[:_ATTRIBUTE_CHARS],
                "dispatcher.tool": call.tool,
                "dispatcher.tool_use_id": call.tool_use_id[:_ATTRIBUTE_CHARS],
                "dispatcher.outcome": call.outcome,
                "dispatcher.ran": call.ran,
            },
        )
        if call.outcome != "ok":
            span.set_status(Status(StatusCode.ERROR, call.outcome))
        span.end()

    def confirmation_waited(self, seconds: float) -> None:
        pass  # inside the tool call's span already

    @contextlib.contextmanager
    def dispatch_span(self, request: Any, context: grpc.aio.ServicerContext) -> Iterator[Any]:
        """The Dispatch span, current (and its trace id in the log context) while the RPC runs."""
        carrier = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        parent = _PROPAGATOR.extract(carrier)
        attributes = {"rpc.system": "grpc", "rpc.method": "Dispatch"}
        with contextlib.suppress(Exception):  # no tenant: refused by auth, the span says so anyway
            attributes["dispatcher.tenant"] = current_tenant().tenant_id
        session_id = getattr(request, "session_id", None)
        if isinstance(session_id, str):
            attributes["dispatcher.session"] = session_id[:_ATTRIBUTE_CHARS]
        span = self.tracer.start_span("Dispatch", context=parent, kind=SpanKind.SERVER, attributes=attributes)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            with log_fields(trace_id=format(span.get_span_context().trace_id, "032x")):
                yield span
        finally:
            otel_context.detach(token)
            span.end()


def _outcome(span: Any, context: grpc.aio.ServicerContext, exc: BaseException | None) -> None:
    code = context.code()
    if exc is not None and not isinstance(code, grpc.StatusCode):
        code = grpc.StatusCode.CANCELLED if not isinstance(exc, Exception) else grpc.StatusCode.UNKNOWN
    name = code.name if isinstance(code, grpc.StatusCode) else "OK"
    span.set_attribute("dispatcher.outcome", name.lower())
    span.set_attribute("rpc.grpc.status_code", code.value[0] if isinstance(code, grpc.StatusCode) else 0)
    if name != "OK":
        span.set_status(Status(StatusCode.ERROR, name))


class _TracingInterceptor(HandlerInterceptor):
    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if details.method != DISPATCH_METHOD or handler.unary_stream is None:
            return handler
        return wrap_handler(handler, around=self._traced)

    @contextlib.asynccontextmanager
    async def _traced(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        with self.tracing.dispatch_span(request, context) as span:
            try:
                yield
            except BaseException as exc:
                _outcome(span, context, exc)
                raise
            _outcome(span, context, None)
