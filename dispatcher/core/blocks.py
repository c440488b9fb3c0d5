"""The plain data at the bottom of the core: side-effect classes, roles, content blocks, a tool's
output. Imports nothing of the dispatcher, so errors, policy and sessions can use them without
importing the pipeline's types."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal


class SideEffect(StrEnum):
    """A tool's highest side-effect class, by capability, not by typical use."""

    NONE = "none"
    READ = "read"
    WRITE = "write"
    EXECUTE = "execute"
    NETWORK = "network"


class Role(StrEnum):
    """Session role; worker sessions do not see tools marked main-only."""

    MAIN = "main"
    WORKER = "worker"


GrantMode = Literal["r", "rw"]
"""What a filesystem grant gives (spec 003): read, or read and write."""
FsMode = Literal[GrantMode, "cwd"]
"""How a tool uses a path (``requires_fs``) and what a grant is checked for: a grant's modes, or
``cwd``, a command's working directory (see ``Capabilities.check_fs``)."""


@dataclass(frozen=True, slots=True)
class TextBlock:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ImageBlock:
    data: bytes
    media_type: str  # image/png, image/jpeg, image/gif, image/webp
    type: Literal["image"] = "image"


ContentBlock = TextBlock | ImageBlock


@dataclass(slots=True)
class ToolOutput:
    """What a tool returns; the dispatcher wraps it into a ToolResultBlock."""

    content: list[ContentBlock]
    success: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)
    files_modified: list[str] | None = None
    command_executed: str | None = None
