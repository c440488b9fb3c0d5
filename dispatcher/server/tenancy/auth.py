"""Bearer-token authentication as a server interceptor.

Every RPC of the dispatcher service needs ``authorization: Bearer <token>``; health and reflection
stay open so that load balancers and ``grpcurl`` work without a token. The authenticated tenant is
handed to the servicer through a context variable, set in the task that runs the RPC.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import grpc

from dispatcher.server.requests.errors import Unauthenticated, status_for
from dispatcher.server.requests.handler_wrap import Around, HandlerInterceptor, wrap_handler
from dispatcher.server.tenancy.tenants import Tenant, TenantDirectory

SERVICE_PREFIX = "/dispatcher.v1.ToolDispatcher/"

_current_tenant: contextvars.ContextVar[Tenant] = contextvars.ContextVar("dispatcher_tenant")


def current_tenant() -> Tenant:
    """The tenant of the RPC being served.

    Raises:
        Unauthenticated: called outside an authenticated RPC (a wiring bug, never a client's fault).
    """
    try:
        return _current_tenant.get()
    except LookupError:
        raise Unauthenticated("no authenticated tenant") from None


class AuthInterceptor(HandlerInterceptor):
    """Rejects calls to the dispatcher service without a valid token with UNAUTHENTICATED."""

    def __init__(self, tenants: TenantDirectory) -> None:
        self._tenants = tenants

    def wrap(self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if not details.method.startswith(SERVICE_PREFIX):
            return handler
        authorization = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                authorization = value if isinstance(value, str) else value.decode("utf-8", "replace")
                break
        try:
            tenant = self._tenants.authenticate(authorization)
        except Unauthenticated as exc:
            # Refused before the behaviour runs: UploadFiles before a byte of its stream is read.
            return wrap_handler(handler, around=_refusal(exc))
        # grpc.aio runs each RPC in a task of its own (_schedule_rpc_coro), and in it awaits the
        # interceptors and then the handler (_handle_rpc): the variable set here is the one the
        # servicer sees, for this RPC only. Every authenticated test depends on it.
        _current_tenant.set(tenant)
        return handler


def _refusal(exc: Unauthenticated) -> Around:
    code, message = status_for(exc)

    @contextlib.asynccontextmanager
    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        await context.abort(code, message)
        yield  # pragma: no cover - abort raises

    return refuse
