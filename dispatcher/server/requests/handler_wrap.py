"""The one place that wraps a gRPC method handler's behaviour, for every interceptor of the server.

A ``grpc.RpcMethodHandler`` holds its behaviour in one of four fields, by whether the request and
the response are streams; each interceptor (auth, metrics, tracing, decode) wants the same thing of
it: run something around the call, or look at each request message before the servicer does.
``wrap_handler`` states that once for the four kinds, so an interceptor says only what it adds.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

__all__ = ["Around", "EachRequest", "HandlerInterceptor", "wrap_handler"]

Around = Callable[[Any, grpc.aio.ServicerContext], AbstractAsyncContextManager[object]]
"""Made per call with (the request, or the request iterator of a client stream, and the context);
entered before the behaviour runs and left when its response or its last message is out, or with
the exception that ended the call (raising in ``__aenter__`` refuses the call unrun)."""

EachRequest = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]
"""Awaited on every request message before the behaviour sees it: the request of a unary-request
call before the behaviour runs, each message of a client stream as the behaviour reads it."""

_NOTHING_AROUND = contextlib.nullcontext()


def _nothing_around(request: Any, context: grpc.aio.ServicerContext) -> AbstractAsyncContextManager[object]:
    return _NOTHING_AROUND


async def _checked(
    requests: AsyncIterator[Any], context: grpc.aio.ServicerContext, each: EachRequest
) -> AsyncIterator[Any]:
    async for request in requests:
        await each(request, context)
        yield request


def wrap_handler(
    handler: grpc.RpcMethodHandler,
    *,
    around: Around | None = None,
    each_request: EachRequest | None = None,
) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour (whichever of the four kinds it is) run inside ``around`` and
    its request messages passed through ``each_request``."""
    enter = around or _nothing_around
    each = each_request
    if handler.unary_unary is not None:
        unary_unary = handler.unary_unary

        async def wrapped_unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with enter(request, context):
                if each is not None:
                    await each(request, context)
                return await unary_unary(request, context)

        return handler._replace(unary_unary=wrapped_unary_unary)
    if handler.unary_stream is not None:
        unary_stream = handler.unary_stream

        async def wrapped_unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with enter(request, context):
                if each is not None:
                    await each(request, context)
                async for item in unary_stream(request, context):
                    yield item

        return handler._replace(unary_stream=wrapped_unary_stream)
    if handler.stream_unary is not None:
        stream_unary = handler.stream_unary

        async def wrapped_stream_unary(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> Any:
            async with enter(requests, context):
                read = requests if each is None else _checked(requests, context, each)
                return await stream_unary(read, context)

        return handler._replace(stream_unary=wrapped_stream_unary)
    if handler.stream_stream is not None:
        stream_stream = handler.stream_stream

        async def wrapped_stream_stream(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            async with enter(requests, context):
                read = requests if each is None else _checked(requests, context, each)
                async for item in stream_stream(read, context):
                    yield item

        return handler._replace(stream_stream=wrapped_stream_stream)
    return handler


class HandlerInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """An interceptor that rewrites the handler of each served method (unknown methods pass by)."""

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        """The handler to serve ``details.method`` with instead of ``handler``."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:  # no such method: grpc answers UNIMPLEMENTED, nothing to wrap
            return handler
        return self.wrap(handler, details)
