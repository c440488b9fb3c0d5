"""The one exceptions module of the dispatch core.

Every tool failure is a ``ToolError`` carrying a member of the closed ``ToolErrorClass``
enum; the dispatcher turns them into ``ToolResultBlock``s with ``is_error=True``. Registration
and configuration problems are ``DispatcherError``s raised to the operator at startup.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from dispatcher.core.blocks import ToolOutput


class ToolErrorClass(StrEnum):
    """The closed set of ways a tool call can fail (spec 000 §6)."""

    NOT_FOUND = "not_found"
    VALIDATION_ERROR = "validation_error"
    PERMISSION_DENIED = "permission_denied"
    USER_DENIED = "user_denied"
    TIMEOUT = "timeout"
    EXECUTION_ERROR = "execution_error"
    CANCELLED = "cancelled"
    CONFIRMATION_TIMEOUT = "confirmation_timeout"


class FailureReason(StrEnum):
    """Why a call failed, finer than its ``ToolErrorClass``: the closed list clients act on
    (``ToolResult.reason``, ``ToolFailed.reason``). Each reason belongs to one class, noted here;
    spec 003's slugs are tool_not_found, invalid_args, fs_denied, tool_failed, and its
    permission_denied is capability_denied."""

    TOOL_NOT_FOUND = "tool_not_found"  # NOT_FOUND: no such tool, or hidden from this session's role
    INVALID_ARGS = "invalid_args"  # VALIDATION_ERROR: not JSON, or not the tool's schema
    INPUT_TOO_LARGE = "input_too_large"  # VALIDATION_ERROR: input_json over dispatcher.max_input_bytes
    CAPABILITY_DENIED = "capability_denied"  # PERMISSION_DENIED: the session may not use the tool
    FS_DENIED = "fs_denied"  # PERMISSION_DENIED: a path is not granted for that access
    WORKSPACE_ESCAPE = "workspace_escape"  # PERMISSION_DENIED: a path leads out of the workspace
    POLICY_DENIED = "policy_denied"  # PERMISSION_DENIED: the confirmation policy denies the tool
    TOO_LONG_TO_CONFIRM = "too_long_to_confirm"  # PERMISSION_DENIED: input too long to show a human
    USER_DENIED = "user_denied"  # USER_DENIED: a human answered deny
    REMEMBERED_DENY = "remembered_deny"  # USER_DENIED: an earlier deny with remember=true
    PLAN_PROPOSED = "plan_proposed"  # USER_DENIED: plan mode held the call as a step; nobody denied it
    PLAN_FULL = "plan_full"  # USER_DENIED: plan mode, and the plan has no room for another step
    TIMEOUT = "timeout"  # TIMEOUT
    CANCELLED = "cancelled"  # CANCELLED
    CONFIRMATION_TIMEOUT = "confirmation_timeout"  # CONFIRMATION_TIMEOUT
    TOOL_FAILED = "tool_failed"  # EXECUTION_ERROR: the tool ran and failed
    QUOTA = "quota"  # EXECUTION_ERROR: a sandbox limit is full (its disk quota, its process limit)
    SANDBOX_FAILED = "sandbox_failed"  # EXECUTION_ERROR: the sandbox broke; it is recreated
    SERVER_RESTARTED = "server_restarted"  # EXECUTION_ERROR: running when the server stopped (events only)


class DispatcherError(Exception):
    """Root of every error this package raises."""


class ToolRegistrationError(DispatcherError, ValueError):
    """A tool definition or factory was rejected at registration."""


class ToolNameConflictError(ToolRegistrationError):
    """A user tool tried to take the name of a built-in tool (spec 001)."""


class RegistrySealedError(ToolRegistrationError):
    """The registry was changed after the server started serving (spec 002)."""


class ConfigError(DispatcherError, ValueError):
    """Configuration is invalid; the message names the offending key."""


class UnknownSessionError(DispatcherError, LookupError):
    """No such session (or it belongs to another tenant)."""


class UnknownConfirmationError(DispatcherError, LookupError):
    """No confirmation request with that id exists in the session."""


class UnknownStagedChangeError(DispatcherError, LookupError):
    """An id names no staged change of the session (``core/staging/area.py``)."""


class ToolError(DispatcherError):
    """A tool call failed; becomes an error result, never a crash.

    ``output`` optionally carries what the tool produced before failing (partial shell
    output on timeout or cancel), which the dispatcher keeps in the result.
    """

    error_class: ClassVar[ToolErrorClass] = ToolErrorClass.EXECUTION_ERROR
    default_reason: ClassVar[FailureReason] = FailureReason.TOOL_FAILED

    def __init__(
        self,
        message: str,
        *,
        tool_use_id: str = "",
        is_user_visible: bool = True,
        output: ToolOutput | None = None,
        reason: FailureReason | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tool_use_id = tool_use_id
        self.is_user_visible = is_user_visible
        self.output = output
        self.reason = reason or self.default_reason
        """Why, finer than the class; raise sites that know better pass it."""


class ToolNotFound(ToolError, LookupError):
    error_class = ToolErrorClass.NOT_FOUND
    default_reason = FailureReason.TOOL_NOT_FOUND


class ToolValidationError(ToolError, ValueError):
    error_class = ToolErrorClass.VALIDATION_ERROR
    default_reason = FailureReason.INVALID_ARGS

    def __init__(self, message: str, validation_errors: list[str] | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.validation_errors = list(validation_errors or [])


class ToolPermissionDenied(ToolError, PermissionError):
    error_class = ToolErrorClass.PERMISSION_DENIED
    default_reason = FailureReason.FS_DENIED


class WorkspaceEscapeError(ToolPermissionDenied):
    """A path resolves outside the session's workspace root."""

    default_reason = FailureReason.WORKSPACE_ESCAPE


class ToolUserDenied(ToolError):
    error_class = ToolErrorClass.USER_DENIED
    default_reason = FailureReason.USER_DENIED


class ToolTimeout(ToolError, TimeoutError):
    error_class = ToolErrorClass.TIMEOUT
    default_reason = FailureReason.TIMEOUT


class ToolExecutionError(ToolError):
    error_class = ToolErrorClass.EXECUTION_ERROR

    def __init__(self, message: str, underlying: BaseException | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.underlying = underlying


class ToolCancelled(ToolError):
    error_class = ToolErrorClass.CANCELLED
    default_reason = FailureReason.CANCELLED


class ConfirmationTimeout(ToolError, TimeoutError):
    error_class = ToolErrorClass.CONFIRMATION_TIMEOUT
    default_reason = FailureReason.CONFIRMATION_TIMEOUT
