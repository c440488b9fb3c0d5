"""Domain types of the dispatch pipeline (spec 000 §3): definitions, blocks, outputs, context."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dispatcher.core.blocks import ContentBlock as ContentBlock
from dispatcher.core.blocks import FsMode as FsMode
from dispatcher.core.blocks import ImageBlock as ImageBlock
from dispatcher.core.blocks import Role as Role
from dispatcher.core.blocks import SideEffect as SideEffect
from dispatcher.core.blocks import TextBlock as TextBlock
from dispatcher.core.blocks import ToolOutput as ToolOutput
from dispatcher.core.errors import FailureReason, ToolErrorClass
from dispatcher.core.process_api import SessionProcesses
from dispatcher.core.sandbox_api import Sandbox, WorkspaceFileAPI


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """What a model sees of a tool, plus what the dispatcher needs to police it."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    side_effect: SideEffect
    requires_fs: tuple[tuple[str, FsMode], ...] = ()
    """(input key, mode) pairs: which inputs are workspace paths and how they are used."""
    check_input: Callable[[Mapping[str, Any]], list[str]] | None = None
    """Checks beyond the schema subset (e.g. a string map's values), run with the schema's at step 2:
    each problem as ``"$.path: message"``; any makes the call a validation error before confirmation."""
    timeout_seconds: float | None = None
    """Overrides the dispatcher's default timeout for this tool (the ``timeouts:`` map wins)."""
    kill_slack_seconds: float = 0.0
    """For a tool that enforces its limit itself (``ToolContext.timeout_seconds``, shortened by a
    ``timeout_seconds`` input) and then stops what it runs: how much longer the dispatcher waits for
    it (and its partial output) before cancelling. 0: the dispatcher enforces the limit."""
    always_prompt: bool = False
    """Ask on every call, whatever the policy, preset or trust says (spec 004)."""
    main_only: bool = False
    """Hidden from worker sessions."""


@dataclass(frozen=True, slots=True)
class ToolUseBlock:
    """One tool call emitted by a model. ``input`` may be anything the client sent."""

    id: str
    name: str
    input: Any


@dataclass(frozen=True, slots=True)
class UnparsedInput:
    """Stands in for a tool input whose JSON did not parse; validation reports it, nothing runs."""

    raw: str
    error: str
    problem: str = "input is not valid JSON"
    """What is wrong in general; ``error`` says where or how (an input too deep to parse is refused)."""
    reason: FailureReason = FailureReason.INVALID_ARGS
    """``input_too_large``: over ``max_input_bytes``, so never parsed (``raw`` is then empty)."""

    def __str__(self) -> str:
        return f"<{self.problem}: {self.error}>"


@dataclass(frozen=True, slots=True)
class ToolResultBlock:
    """The canonical answer to one ToolUseBlock; errors included."""

    tool_use_id: str
    content: tuple[ContentBlock, ...]
    is_error: bool = False
    error_class: ToolErrorClass | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    files_modified: tuple[str, ...] = ()
    command_executed: str | None = None
    reason: str = ""
    """Why it failed, finer than ``error_class``: a ``FailureReason`` value ("" on success; a
    client may receive values a newer server added)."""


OutputSink = Callable[[str, str], "asyncio.Future[None] | None"]
"""``emit_output(stream, text)``: publish a ``tool.output_delta`` event for this call. A future
back: the caller's stream is full (``EventBus.room``); a producer that can wait (a command's output
stream) produces nothing more until it is done. Ignoring it is safe, not lossless."""


@dataclass(slots=True)
class ToolContext:
    """What a tool sees of its session for one call."""

    session_id: str
    turn_id: str
    tool_use_id: str
    workspace_path: str
    cancel_event: asyncio.Event
    logger: logging.LoggerAdapter[logging.Logger]
    workspace_files: WorkspaceFileAPI
    sandbox: Sandbox
    emit_output: OutputSink
    resolved: Mapping[str, str] = field(default_factory=dict)
    """``requires_fs`` input key -> where that path really was (workspace-relative) when the call
    was checked and confirmed; pass it on as ``approved=`` so exactly that path is used. Empty when
    nothing was resolved (no question, no grants: the sandbox checks the path at use alone)."""
    timeout_seconds: float | None = None
    """The limit this call runs under (see ``core/call/timeouts.py``); None outside the dispatcher."""
    processes: SessionProcesses | None = None
    """What the session remembers between calls of its shell and its background processes
    (``core/sessions/processes.py``); None outside the dispatcher: nothing is remembered."""


@runtime_checkable
class Tool(Protocol):
    """Implemented by every tool. One fresh instance handles one execute()."""

    definition: ToolDefinition

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput: ...

    async def cancel(self) -> bool: ...


@runtime_checkable
class Previewable(Protocol):
    """What a tool that replaces one file whole may offer besides ``execute``: the content the
    call would leave, computed without writing. The file is the input named by the one ``rw``
    entry of its ``requires_fs``. Review and audit modes (spec 004) stage this instead of running
    the call (``core/call/review.py``), and a human applies exactly these bytes later; the tool writes
    exactly this when it runs, so both paths have one semantics."""

    def preview(self, input: Mapping[str, Any], current: bytes | None) -> bytes:
        """The file's bytes after the call, given its bytes now (None: there is no file).

        Raises:
            ToolError: the call cannot apply to ``current``; nothing is to be written.
        """
        ...


ToolFactory = Callable[[], Tool]
AsyncCallback = Callable[[], Awaitable[None]]
