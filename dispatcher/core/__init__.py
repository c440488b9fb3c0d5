"""The dispatch core: a pure library (no grpc, no docker) implementing spec 000's pipeline.

The names below are loaded when first used, not when the package is: a client that needs only the
data types (``dispatcher.client``) must not load the pipeline, the approval step or ``jsonschema``.
Import a module of the core directly where its weight matters.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names as _LAZY, for type checkers (a unit test keeps the two equal)
    from dispatcher.core.approval.broker import Decision
    from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy, Mode
    from dispatcher.core.audit import AuditLog, AuditSink, MemoryAuditLog
    from dispatcher.core.capabilities import Capabilities, FsGrant
    from dispatcher.core.dispatcher import DispatcherConfig, ToolDispatcher
    from dispatcher.core.errors import (
        ConfigError,
        ConfirmationTimeout,
        DispatcherError,
        RegistrySealedError,
        ToolCancelled,
        ToolError,
        ToolErrorClass,
        ToolExecutionError,
        ToolNameConflictError,
        ToolNotFound,
        ToolPermissionDenied,
        ToolRegistrationError,
        ToolTimeout,
        ToolUserDenied,
        ToolValidationError,
        UnknownConfirmationError,
        UnknownSessionError,
        WorkspaceEscapeError,
    )
    from dispatcher.core.events.bus import Event, EventBus
    from dispatcher.core.provider_api import SandboxProvider
    from dispatcher.core.registry import ToolRegistry
    from dispatcher.core.sandbox_api import Sandbox, SandboxError, WorkspaceFileAPI
    from dispatcher.core.sessions.session import Session
    from dispatcher.core.tool_shapes import ToolFormat, to_anthropic, to_mcp, to_openai, to_provider
    from dispatcher.core.types import (
        ContentBlock,
        ImageBlock,
        Role,
        SideEffect,
        TextBlock,
        Tool,
        ToolContext,
        ToolDefinition,
        ToolOutput,
        ToolResultBlock,
        ToolUseBlock,
    )

_LAZY: dict[str, str] = {
    "AuditLog": "dispatcher.core.audit",
    "AuditSink": "dispatcher.core.audit",
    "MemoryAuditLog": "dispatcher.core.audit",
    "Capabilities": "dispatcher.core.capabilities",
    "FsGrant": "dispatcher.core.capabilities",
    "Decision": "dispatcher.core.approval.broker",
    "DispatcherConfig": "dispatcher.core.dispatcher",
    "ToolDispatcher": "dispatcher.core.dispatcher",
    "ConfigError": "dispatcher.core.errors",
    "ConfirmationTimeout": "dispatcher.core.errors",
    "DispatcherError": "dispatcher.core.errors",
    "RegistrySealedError": "dispatcher.core.errors",
    "ToolCancelled": "dispatcher.core.errors",
    "ToolError": "dispatcher.core.errors",
    "ToolErrorClass": "dispatcher.core.errors",
    "ToolExecutionError": "dispatcher.core.errors",
    "ToolNameConflictError": "dispatcher.core.errors",
    "ToolNotFound": "dispatcher.core.errors",
    "ToolPermissionDenied": "dispatcher.core.errors",
    "ToolRegistrationError": "dispatcher.core.errors",
    "ToolTimeout": "dispatcher.core.errors",
    "ToolUserDenied": "dispatcher.core.errors",
    "ToolValidationError": "dispatcher.core.errors",
    "UnknownConfirmationError": "dispatcher.core.errors",
    "UnknownSessionError": "dispatcher.core.errors",
    "WorkspaceEscapeError": "dispatcher.core.errors",
    "Event": "dispatcher.core.events.bus",
    "EventBus": "dispatcher.core.events.bus",
    "ConfirmationPolicy": "dispatcher.core.approval.confirmation_policy",
    "Mode": "dispatcher.core.approval.confirmation_policy",
    "ToolRegistry": "dispatcher.core.registry",
    "to_anthropic": "dispatcher.core.tool_shapes",
    "to_mcp": "dispatcher.core.tool_shapes",
    "to_openai": "dispatcher.core.tool_shapes",
    "to_provider": "dispatcher.core.tool_shapes",
    "ToolFormat": "dispatcher.core.tool_shapes",
    "Sandbox": "dispatcher.core.sandbox_api",
    "SandboxError": "dispatcher.core.sandbox_api",
    "SandboxProvider": "dispatcher.core.provider_api",
    "WorkspaceFileAPI": "dispatcher.core.sandbox_api",
    "Session": "dispatcher.core.sessions.session",
    "ContentBlock": "dispatcher.core.types",
    "ImageBlock": "dispatcher.core.types",
    "Role": "dispatcher.core.types",
    "SideEffect": "dispatcher.core.types",
    "TextBlock": "dispatcher.core.types",
    "Tool": "dispatcher.core.types",
    "ToolContext": "dispatcher.core.types",
    "ToolDefinition": "dispatcher.core.types",
    "ToolOutput": "dispatcher.core.types",
    "ToolResultBlock": "dispatcher.core.types",
    "ToolUseBlock": "dispatcher.core.types",
}
"""Each public name and the module that defines it."""

__all__ = [
    "AuditLog",
    "AuditSink",
    "Capabilities",
    "ConfigError",
    "ConfirmationPolicy",
    "ConfirmationTimeout",
    "ContentBlock",
    "Decision",
    "DispatcherConfig",
    "DispatcherError",
    "Event",
    "EventBus",
    "FsGrant",
    "ImageBlock",
    "MemoryAuditLog",
    "Mode",
    "RegistrySealedError",
    "Role",
    "Sandbox",
    "SandboxError",
    "SandboxProvider",
    "Session",
    "SideEffect",
    "TextBlock",
    "Tool",
    "ToolCancelled",
    "ToolContext",
    "ToolDefinition",
    "ToolDispatcher",
    "ToolError",
    "ToolErrorClass",
    "ToolExecutionError",
    "ToolFormat",
    "ToolNameConflictError",
    "ToolNotFound",
    "ToolOutput",
    "ToolPermissionDenied",
    "ToolRegistrationError",
    "ToolRegistry",
    "ToolResultBlock",
    "ToolTimeout",
    "ToolUseBlock",
    "ToolUserDenied",
    "ToolValidationError",
    "UnknownConfirmationError",
    "UnknownSessionError",
    "WorkspaceEscapeError",
    "WorkspaceFileAPI",
    "to_anthropic",
    "to_mcp",
    "to_openai",
    "to_provider",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
