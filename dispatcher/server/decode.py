"""Requests whose bytes do not parse get INVALID_ARGUMENT, not UNKNOWN naming a Python exception.

grpc.aio deserialises a request before any servicer code or interceptor behaviour runs, and turns
an exception raised there into ``UNKNOWN: Unexpected <class '...DecodeError'>``. A tenant controls
every byte of a request (a string field with bad UTF-8, a truncated varint), so that is the
client's mistake and gets the client's status. The deserializer is wrapped to return a marker
instead of raising, and the handler's behaviour aborts with INVALID_ARGUMENT when it sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

_MESSAGE_LIMIT = 200  # characters of the parser's complaint passed on to the client


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Stands in for a request message whose bytes did not parse."""

    message: str


def _safe_deserializer(deserializer: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # DecodeError, and whatever else a parser raises on hostile bytes
            reason = str(exc)[:_MESSAGE_LIMIT] or type(exc).__name__
            return Undecodable(f"{method}: the request message does not parse: {reason}")

    return decode


def _guard_unary(behavior: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        return await behavior(request, context)

    return unary


def _guard_stream(
    behavior: Callable[[Any, Any], AsyncIterator[Any]],
) -> Callable[[Any, Any], AsyncIterator[Any]]:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
        async for item in behavior(request, context):
            yield item

    return stream


def _guard_client_stream(
    behavior: Callable[[Any, Any], Awaitable[Any]],
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def client_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async def checked() -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                yield request

        return await behavior(checked(), context)

    return client_stream


def guard_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` with its request parsing made safe (unary and client-streaming requests)."""
    if handler.request_deserializer is None:
        return handler
    deserializer = _safe_deserializer(handler.request_deserializer, method)
    if handler.stream_unary is not None:  # UploadFiles: each message of the stream is checked
        return handler._replace(
            request_deserializer=deserializer, stream_unary=_guard_client_stream(handler.stream_unary)
        )
    if handler.request_streaming:
        return handler  # no bidirectional RPC is served
    if handler.unary_unary is not None:
        return handler._replace(
            request_deserializer=deserializer, unary_unary=_guard_unary(handler.unary_unary)
        )
    if handler.unary_stream is not None:
        return handler._replace(
            request_deserializer=deserializer, unary_stream=_guard_stream(handler.unary_stream)
        )
    return handler


class DecodeGuardInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Applies ``guard_handler`` to every method served (the wrapped handler is built once per method)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return None
        cached = self._cache.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = guard_handler(handler, details.method)
        if len(self._cache) < 1024:  # methods are a closed set; unknown names return None above
            self._cache[details.method] = (handler, guarded)
        return guarded
