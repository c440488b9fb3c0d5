"""Python client of the dispatcher service; hides the generated stubs behind domain objects.

Sync::

    with DispatcherClient() as client:                 # 127.0.0.1:50051, token from ~/.dispatcher/token
        session = client.create_session("demo")
        result = client.call(session.session_id, "read_file", {"path": "README.md"})
        for item in client.dispatch(session.session_id, [ToolUseBlock("t1", "shell", {"command": "ls"})]):
            ...                                        # Event ... then ToolResultBlock

Async: ``AsyncDispatcherClient`` has the same methods as coroutines / async iterators.

With a model provider's SDK::

    tools = client.tools_for(session, "anthropic")     # or "openai", "mcp": that API's `tools`
    results = [client.call(session.session_id, use.name, use.input) for use in tool_uses]
    messages.append(anthropic_tool_results(results))   # openai: messages += openai_tool_messages(results)

The target defaults to ``DISPATCHER_LISTEN`` (else 127.0.0.1:50051); the token to ``DISPATCHER_TOKEN``
(else ``<DISPATCHER_HOME or ~/.dispatcher>/token``); TLS is used when a CA file is given
(``tls_ca=`` or ``DISPATCHER_TLS_CA``), with ``tls_cert``/``tls_key`` for mutual TLS. Request failures raise ``RequestFailed`` carrying
the gRPC status name; tool failures are results with ``is_error``.
"""

from __future__ import annotations

from dispatcher.client.aio import AsyncDispatcherClient
from dispatcher.client.base import Answer, RequestFailed
from dispatcher.client.ports import OpenedPort, PortConnection
from dispatcher.client.providers import anthropic_tool_results, openai_tool_messages
from dispatcher.client.sync import DispatcherClient
from dispatcher.core.approval.broker import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.process_api import CodeContext, OutputChunk, ProcessInfo
from dispatcher.core.transfer import UploadSummary
from dispatcher.core.types import Role, ToolResultBlock, ToolUseBlock
from dispatcher.trees import Extracted, LocalTreeError
from dispatcher.wire.convert import PreviewPort, SessionInfo, ToolInfo
from dispatcher.wire.convert_processes import ProcessTruncated, WatchItem
from dispatcher.wire.convert_staged import StagedApplyResult, StagedChangeInfo, StagedRefusal

__all__ = [
    "Answer",
    "AsyncDispatcherClient",
    "CodeContext",
    "Decision",
    "DispatcherClient",
    "Event",
    "Extracted",
    "LocalTreeError",
    "OpenedPort",
    "OutputChunk",
    "PortConnection",
    "PreviewPort",
    "ProcessInfo",
    "ProcessTruncated",
    "RequestFailed",
    "Role",
    "SessionInfo",
    "StagedApplyResult",
    "StagedChangeInfo",
    "StagedRefusal",
    "ToolInfo",
    "ToolResultBlock",
    "ToolUseBlock",
    "UploadSummary",
    "WatchItem",
    "anthropic_tool_results",
    "openai_tool_messages",
]
