"""Requests whose bytes do not parse get INVALID_ARGUMENT, not UNKNOWN naming a Python exception.

grpc.aio deserialises a request before any servicer code or interceptor behaviour runs, and turns
an exception raised there into ``UNKNOWN: Unexpected <class '...DecodeError'>``. A tenant controls
every byte of a request (a string field with bad UTF-8, a truncated varint), so that is the
client's mistake and gets the client's status. The deserializer is wrapped to return a marker
instead of raising, and the handler's behaviour aborts with INVALID_ARGUMENT when it sees it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from dispatcher.server.requests.handler_wrap import HandlerInterceptor, wrap_handler

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


async def _refuse_undecodable(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, Undecodable):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


def guard_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """``handler`` with its request parsing made safe (unary and client-streaming requests)."""
    if handler.request_deserializer is None:
        return handler
    if handler.request_streaming and handler.response_streaming:
        return handler  # no bidirectional RPC of ours is served (reflection's is left as grpc has it)
    # UploadFiles (client-streaming): each message of the stream is checked as it is read.
    deserializer = _safe_deserializer(handler.request_deserializer, method)
    return wrap_handler(handler._replace(request_deserializer=deserializer), each_request=_refuse_undecodable)


class DecodeGuardInterceptor(HandlerInterceptor):
    """Applies ``guard_handler`` to every method served (the wrapped handler is built once per method)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        cached = self._cache.get(details.method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        guarded = guard_handler(handler, details.method)
        if len(self._cache) < 1024:  # methods are a closed set; unknown names never get here
            self._cache[details.method] = (handler, guarded)
        return guarded
