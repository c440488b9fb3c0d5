"""Proto <-> domain conversion, both directions: the server uses one, the Python client the other.

Nothing here knows about status codes or sessions' state; it only translates shapes. Enum values
map by their domain string (``SideEffect.READ`` <-> ``SIDE_EFFECT_READ``; ``convert_enums.py``).
The enums' converters are importable from here too, as the server and the clients use them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.core import jsonlimits
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.errors import FailureReason
from dispatcher.core.sessions.state import PlanStep
from dispatcher.core.tool_shapes import ToolFormat, to_provider
from dispatcher.core.types import (
    ContentBlock,
    ImageBlock,
    Role,
    SideEffect,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    UnparsedInput,
)
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert_lifecycle as cl
from dispatcher.wire import convert_policy as cp
from dispatcher.wire.convert_enums import (
    decision_from_pb,
    decision_to_pb,
    error_class_from_pb,
    error_class_to_pb,
    ordering_from_pb,
    ordering_to_pb,
    role_from_pb,
    role_to_pb,
    side_effect_from_pb,
    side_effect_to_pb,
    tool_format_from_pb,
    tool_format_to_pb,
)
from dispatcher.wire.convert_events import encode_loose, event_from_pb, event_to_pb

__all__ = [
    "SessionInfo",
    "ToolInfo",
    "decision_from_pb",
    "decision_to_pb",
    "definitions_json",
    "error_class_from_pb",
    "error_class_to_pb",
    "event_from_pb",
    "event_to_pb",
    "ordering_from_pb",
    "ordering_to_pb",
    "result_from_pb",
    "result_to_pb",
    "role_from_pb",
    "role_to_pb",
    "session_from_pb",
    "session_to_pb",
    "side_effect_from_pb",
    "side_effect_to_pb",
    "tool_format_from_pb",
    "tool_format_to_pb",
    "tool_from_pb",
    "tool_to_pb",
    "tool_use_from_pb",
    "tool_use_to_pb",
    "tool_uses_from_pb",
]


@dataclass(frozen=True, slots=True)
class PreviewPort:
    """A port of the session's sandbox open to the preview gateway (OpenPort); never its token."""

    port: int
    url: str
    public: bool = False
    expire_time: float | None = None
    """When it expires (None: it does not)."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as clients see it."""

    session_id: str
    workspace: str
    workspace_path: str
    role: Role = Role.MAIN
    labels: Mapping[str, str] = field(default_factory=dict)
    create_time: float = 0.0
    last_event_seq: int = 0
    approval_mode: str = "cautious"
    """The approval mode in force (spec 004)."""
    capabilities: Capabilities = field(default_factory=Capabilities)
    """What the session may use (None parts: unrestricted)."""
    plan: tuple[PlanStep, ...] = ()
    """Steps a plan-mode session proposed, awaiting ApprovePlan."""
    expire_time: float | None = None
    """When its TTL runs out (None: no TTL)."""
    idle_expire_time: float | None = None
    """When it expires if idle until then (None: no idle timeout, or paused)."""
    paused: bool = False
    pending_request_ids: tuple[str, ...] = ()
    """Confirmation requests waiting for an answer."""
    last_activity_time: float = 0.0
    open_ports: tuple[PreviewPort, ...] = ()
    """Its ports open to the preview gateway, by port (filled by the server's RPCs)."""


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """A tool as clients see it."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    side_effect: SideEffect
    always_prompt: bool = False
    """Every call asks a human, in every approval mode; an answer is never remembered for it."""


# --- tools and calls -------------------------------------------------------------------------------


def tool_to_pb(definition: ToolDefinition) -> pb.Tool:
    return pb.Tool(
        name=definition.name,
        description=definition.description,
        input_schema_json=json.dumps(definition.input_schema, sort_keys=True),
        side_effect=side_effect_to_pb(definition.side_effect),
        always_prompt=definition.always_prompt,
    )


def definitions_json(definitions: Sequence[ToolDefinition], format: ToolFormat) -> str:
    """The definitions as one JSON array in ``format``'s shape (``ListToolsResponse.definitions_json``)."""
    return json.dumps([to_provider(d, format) for d in definitions], ensure_ascii=False)


def tool_from_pb(msg: pb.Tool) -> ToolInfo:
    schema = json.loads(msg.input_schema_json) if msg.input_schema_json else {}
    return ToolInfo(
        msg.name,
        msg.description,
        schema,
        side_effect_from_pb(msg.side_effect) or SideEffect.EXECUTE,
        always_prompt=msg.always_prompt,
    )


def tool_use_from_pb(msg: pb.ToolUse, max_input_bytes: int | None = None) -> ToolUseBlock:
    """Invalid JSON is not a request error: the core turns the placeholder into a validation result.

    So is JSON too deep or too large in values to handle: it is refused before it is parsed, and
    so is an input of more than ``max_input_bytes`` (it is not even kept).
    """
    tool_input: Any
    size = _input_bytes(msg.input_json, max_input_bytes)
    if max_input_bytes is not None and size > max_input_bytes:
        tool_input = UnparsedInput(
            "",
            f"{size:,} bytes, more than the limit of {max_input_bytes:,} bytes for one tool input "
            "(dispatcher.max_input_bytes); send large files with UploadFiles",
            problem="input is too large",
            reason=FailureReason.INPUT_TOO_LARGE,
        )
        return ToolUseBlock(id=msg.id, name=msg.name, input=tool_input)
    try:
        tool_input = jsonlimits.loads(msg.input_json) if msg.input_json.strip() else {}
    except jsonlimits.InputShapeError as exc:
        tool_input = UnparsedInput(msg.input_json, str(exc), problem="input is refused")
    except (ValueError, RecursionError) as exc:
        tool_input = UnparsedInput(msg.input_json, str(exc))
    return ToolUseBlock(id=msg.id, name=msg.name, input=tool_input)


def _input_bytes(text: str, limit: int | None) -> int:
    """UTF-8 bytes of ``text``, counted only when its length alone cannot settle the limit."""
    if limit is None or len(text) > limit or len(text) * 4 <= limit:
        return len(text)  # over by characters already, or under even at 4 bytes a character
    return len(text.encode("utf-8", "surrogatepass"))


def tool_use_to_pb(block: ToolUseBlock) -> pb.ToolUse:
    raw = block.input if isinstance(block.input, str) else json.dumps(block.input)
    return pb.ToolUse(id=block.id, name=block.name, input_json=raw)


def _content_to_pb(block: ContentBlock) -> pb.ContentBlock:
    if isinstance(block, ImageBlock):
        return pb.ContentBlock(image=pb.ImageContent(data=block.data, media_type=block.media_type))
    return pb.ContentBlock(text=pb.TextContent(text=block.text))


def _content_from_pb(msg: pb.ContentBlock) -> ContentBlock:
    if msg.WhichOneof("block") == "image":
        return ImageBlock(data=msg.image.data, media_type=msg.image.media_type)
    return TextBlock(text=msg.text.text)


def result_to_pb(result: ToolResultBlock) -> pb.ToolResult:
    msg = pb.ToolResult(
        tool_use_id=result.tool_use_id,
        is_error=result.is_error,
        error_class=error_class_to_pb(result.error_class) if result.is_error else pb.ERROR_CLASS_UNSPECIFIED,
        content=[_content_to_pb(b) for b in result.content],
        metadata_json=encode_loose(dict(result.metadata)) if result.metadata else "{}",
        files_modified=list(result.files_modified),
        reason=result.reason if result.is_error else "",
    )
    if result.command_executed is not None:
        msg.command_executed = result.command_executed
    return msg


def result_from_pb(msg: pb.ToolResult) -> ToolResultBlock:
    return ToolResultBlock(
        tool_use_id=msg.tool_use_id,
        content=tuple(_content_from_pb(b) for b in msg.content),
        is_error=msg.is_error,
        error_class=error_class_from_pb(msg.error_class),
        metadata=json.loads(msg.metadata_json) if msg.metadata_json else {},
        files_modified=tuple(msg.files_modified),
        command_executed=msg.command_executed if msg.HasField("command_executed") else None,
        reason=msg.reason,
    )


# --- sessions --------------------------------------------------------------------------------------


def session_to_pb(info: SessionInfo) -> pb.Session:
    msg = pb.Session(
        session_id=info.session_id,
        workspace=info.workspace,
        workspace_path=info.workspace_path,
        role=role_to_pb(info.role),
        labels=dict(info.labels),
        last_event_seq=info.last_event_seq,
        approval_mode=cp.mode_to_pb(info.approval_mode),
        capabilities=cp.capabilities_to_pb(info.capabilities),
        plan=[cp.plan_step_to_pb(step) for step in info.plan],
    )
    msg.create_time.FromNanoseconds(int(info.create_time * 1e9))
    msg.state = cl.state_to_pb(info.paused)
    msg.pending_request_ids.extend(info.pending_request_ids)
    msg.last_activity_time.FromNanoseconds(int(info.last_activity_time * 1e9))
    if info.expire_time is not None:
        msg.expire_time.FromNanoseconds(int(info.expire_time * 1e9))
    if info.idle_expire_time is not None:
        msg.idle_expire_time.FromNanoseconds(int(info.idle_expire_time * 1e9))
    return msg


def session_from_pb(msg: pb.Session) -> SessionInfo:
    return SessionInfo(
        session_id=msg.session_id,
        workspace=msg.workspace,
        workspace_path=msg.workspace_path,
        role=role_from_pb(msg.role) or Role.MAIN,
        labels=dict(msg.labels),
        create_time=msg.create_time.ToNanoseconds() / 1e9,
        last_event_seq=msg.last_event_seq,
        approval_mode=str(cp.mode_from_pb(msg.approval_mode) or "cautious"),
        capabilities=cp.capabilities_from_pb(msg.capabilities, True, check=False) or Capabilities(),
        plan=tuple(cp.plan_step_from_pb(step) for step in msg.plan),
        expire_time=msg.expire_time.ToNanoseconds() / 1e9 if msg.HasField("expire_time") else None,
        idle_expire_time=(
            msg.idle_expire_time.ToNanoseconds() / 1e9 if msg.HasField("idle_expire_time") else None
        ),
        paused=msg.state == pb.SESSION_STATE_PAUSED,
        pending_request_ids=tuple(msg.pending_request_ids),
        last_activity_time=msg.last_activity_time.ToNanoseconds() / 1e9,
        open_ports=tuple(
            PreviewPort(
                p.port,
                p.url,
                p.public,
                p.expire_time.ToNanoseconds() / 1e9 if p.HasField("expire_time") else None,
            )
            for p in msg.open_ports
        ),
    )


def tool_uses_from_pb(msgs: Sequence[pb.ToolUse], max_input_bytes: int | None = None) -> list[ToolUseBlock]:
    return [tool_use_from_pb(m, max_input_bytes) for m in msgs]
