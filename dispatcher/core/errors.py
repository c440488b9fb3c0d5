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


class ToolError(DispatcherError):
    """A tool call failed; becomes an error result, never a crash.

    ``output`` optionally carries what the tool produced before failing (partial shell
    output on timeout or cancel), which the dispatcher keeps in the result.
    """

    error_class: ClassVar[ToolErrorClass] = ToolErrorClass.EXECUTION_ERROR

    def __init__(
        self,
        message: str,
        *,
        tool_use_id: str = "",
        is_user_visible: bool = True,
        output: ToolOutput | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tool_use_id = tool_use_id
        self.is_user_visible = is_user_visible
        self.output = output


class ToolNotFound(ToolError, LookupError):
    error_class = ToolErrorClass.NOT_FOUND


class ToolValidationError(ToolError, ValueError):
    error_class = ToolErrorClass.VALIDATION_ERROR

    def __init__(self, message: str, validation_errors: list[str] | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.validation_errors = list(validation_errors or [])


class ToolPermissionDenied(ToolError, PermissionError):
    error_class = ToolErrorClass.PERMISSION_DENIED


class WorkspaceEscapeError(ToolPermissionDenied):
    """A path resolves outside the session's workspace root."""


class ToolUserDenied(ToolError):
    error_class = ToolErrorClass.USER_DENIED


class ToolTimeout(ToolError, TimeoutError):
    error_class = ToolErrorClass.TIMEOUT


class ToolExecutionError(ToolError):
    error_class = ToolErrorClass.EXECUTION_ERROR

    def __init__(self, message: str, underlying: BaseException | None = None, **kw: object) -> None:
        super().__init__(message, **kw)  # type: ignore[arg-type]
        self.underlying = underlying


class ToolCancelled(ToolError):
    error_class = ToolErrorClass.CANCELLED


class ConfirmationTimeout(ToolError, TimeoutError):
    error_class = ToolErrorClass.CONFIRMATION_TIMEOUT
