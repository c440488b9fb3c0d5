"""What every RPC handler of the servicer shares: the two decorators that map a handler's exception
to its status code (``unary``, ``stream``), and ``RpcArea``, the base of the per-area handler
mixins the servicer (``servicer.py``) composes."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc

from dispatcher.server.requests.errors import status_for
from dispatcher.server.sessions.manager import SessionManager

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx: TypeAlias = grpc.aio.ServicerContext


def unary(
    fn: Callable[[Any, Req, Ctx], Awaitable[Resp]],
) -> Callable[[Any, Req, Ctx], Awaitable[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> Resp:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*status_for(exc))
            raise  # unreachable: abort raises

    return wrapper


def stream(
    fn: Callable[[Any, Req, Ctx], AsyncIterator[Resp]],
) -> Callable[[Any, Req, Ctx], AsyncIterator[Resp]]:
    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: Ctx) -> AsyncIterator[Resp]:
        try:
            async for item in fn(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort(*status_for(exc))

    return wrapper


class RpcArea:
    """One area's RPCs, mixed into ``DispatcherServicer``, which sets what they use."""

    _sessions: SessionManager
