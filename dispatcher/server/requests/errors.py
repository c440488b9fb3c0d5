"""Request-level failures of the gRPC layer and the one function that maps exceptions to status codes.

Tool failures never come through here: they are results. What does is a problem with the request
itself (who asks, which session, what shape), each with one gRPC status code (design.md §4).
"""

from __future__ import annotations

import logging

import grpc

from dispatcher.core.errors import (
    ConfigError,
    DispatcherError,
    UnknownConfirmationError,
    UnknownSessionError,
    UnknownStagedChangeError,
)
from dispatcher.core.process_api import ProcessError
from dispatcher.core.sandbox_api import PortError

log = logging.getLogger("dispatcher.server")


class RequestError(DispatcherError):
    """A request the server refuses; never a tool failure."""


class Unauthenticated(RequestError, PermissionError):
    """No bearer token, or one that maps to no tenant."""


class InvalidRequest(RequestError, ValueError):
    """The request is malformed (no tool_uses, duplicate ids, a workspace escaping the root, ...)."""


class FailedPrecondition(RequestError):
    """The session is not in the state the request needs (ApprovePlan outside plan mode)."""


class NotFound(RequestError, LookupError):
    """No such thing of this tenant's (a snapshot; another tenant's looks the same)."""


class QuotaExceeded(RequestError):
    """A tenant quota (sessions, concurrent dispatches) is used up."""


class AlreadyExists(RequestError):
    """A CreateSession request_id already names a different request."""


class ShuttingDown(RequestError):
    """The server is draining; new calls are refused."""


class SandboxUnavailable(RequestError):
    """The session's sandbox failed while serving a request that is not a tool call (a process
    operation); the message says what to do (retry, watch again from a cursor)."""


_STATUS: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (UnknownSessionError, grpc.StatusCode.NOT_FOUND),
    (UnknownConfirmationError, grpc.StatusCode.NOT_FOUND),
    (UnknownStagedChangeError, grpc.StatusCode.NOT_FOUND),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (ConfigError, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (QuotaExceeded, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (SandboxUnavailable, grpc.StatusCode.UNAVAILABLE),
)

_PROCESS_STATUS: dict[str, grpc.StatusCode] = {
    "no_process": grpc.StatusCode.NOT_FOUND,
    "conflict": grpc.StatusCode.ALREADY_EXISTS,
    "too_many": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "too_large": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "not_running": grpc.StatusCode.FAILED_PRECONDITION,
    "unsupported": grpc.StatusCode.FAILED_PRECONDITION,
}
"""A refused process operation (``ProcessError.code``) asked by a client rather than a tool."""


_PORT_STATUS: dict[str, grpc.StatusCode] = {
    "bad_port": grpc.StatusCode.INVALID_ARGUMENT,
    "refused": grpc.StatusCode.UNAVAILABLE,  # nothing listens yet: retry once it does
    "unsupported": grpc.StatusCode.FAILED_PRECONDITION,
    "too_many": grpc.StatusCode.RESOURCE_EXHAUSTED,
}
"""A connection to a sandbox's port that could not be made (``PortError.code``)."""


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and client-safe message for an exception raised while serving a request.

    Anything unexpected is INTERNAL with a generic message; the traceback goes to the log only.
    """
    if isinstance(exc, ProcessError) and exc.code in _PROCESS_STATUS:
        return _PROCESS_STATUS[exc.code], str(exc)
    if isinstance(exc, PortError):
        return _PORT_STATUS[exc.code], str(exc)
    for cls, code in _STATUS:
        if isinstance(exc, cls):
            log.debug("request refused", extra={"code": code.name, "reason": str(exc)})
            return code, str(exc) or code.name.lower()
    log.error("internal error serving a request", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error (see the server log)"
