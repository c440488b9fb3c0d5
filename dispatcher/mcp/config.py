"""The ``mcp_servers:`` section: stdio MCP servers whose tools are registered as ``mcp_<server>_<tool>``.

Example::

    mcp_servers:
      notes:                          # [a-z0-9_], at most 32 characters
        command: python3              # the executable (PATH is searched)
        args: [-m, notes_server]
        env: {NOTES_DIR: /srv/notes}  # added to a minimal environment (PATH, HOME, LANG, ...)
        run: host                     # host (trusted servers only) | sandbox (the calling session's)
        side_effect: read             # the default class of its tools (default: execute)
        always_prompt: false          # ask on every call of every tool of this server
        timeout_seconds: 30           # per call (default: the dispatcher's for the class)
        startup_timeout_seconds: 30   # start + initialize + tools/list
        cancel_grace_seconds: 3       # after notifications/cancelled, before the process is killed
        tools:                        # by the MCP server's own tool name
          delete_note: {side_effect: write, always_prompt: true}

Every error names its key (``mcp_servers.notes.tools.delete_note.side_effect: ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StringConstraints

from dispatcher.config_base import Section, validate_section
from dispatcher.core.types import SideEffect

SERVER_NAME_PATTERN = r"^[a-z0-9_]{1,32}$"
"""So ``mcp_<server>_<tool>`` stays a valid tool name whatever the server calls its tools."""
MAX_TOOL_NAME = 128
_MAX_ARGS = 256
_MAX_STRING = 4096

RunWhere = Literal["host", "sandbox"]


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("must not contain a NUL character")
    return value


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


Arg = Annotated[str, StringConstraints(strict=True, max_length=_MAX_STRING), AfterValidator(_no_nul)]
EnvName = Annotated[str, StringConstraints(strict=True, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
EnvValue = Annotated[str, StringConstraints(strict=True, max_length=_MAX_STRING * 8), AfterValidator(_no_nul)]
_EFFECT_NAMES = tuple(e.value for e in SideEffect) + tuple(e.value.upper() for e in SideEffect)
Effect = Annotated[SideEffect, BeforeValidator(_lower, json_schema_input_type=Literal[_EFFECT_NAMES])]
McpSeconds = Annotated[float, Field(strict=True, gt=0, le=86_400, allow_inf_nan=False)]
ServerName = Annotated[str, StringConstraints(strict=True, pattern=SERVER_NAME_PATTERN)]
ToolName = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=MAX_TOOL_NAME)]


class McpToolOverride(Section):
    """What the config says about one of a server's tools (None: the server's default)."""

    side_effect: Effect | None = None
    """This tool's side-effect class (default: the server's)."""
    always_prompt: StrictBool | None = None
    """Ask on every call of this tool (default: the server's)."""


class McpServerSpec(Section):
    """One stdio MCP server as the config file gives it (its name is the key above it)."""

    command: Annotated[Arg, Field(min_length=1)]
    """The executable (PATH is searched)."""
    args: Annotated[tuple[Arg, ...], Field(max_length=_MAX_ARGS)] = ()
    """Its arguments."""
    env: dict[EnvName, EnvValue] = Field(default_factory=dict)
    """Added to a minimal environment (PATH, HOME, LANG, ...)."""
    run: RunWhere = "host"
    """``host`` (trusted servers only) or ``sandbox`` (in the calling session's sandbox)."""
    side_effect: Effect = SideEffect.EXECUTE
    """The class of every tool the config does not list: an unknown tool may do anything."""
    always_prompt: StrictBool = False
    """Ask on every call of every tool of this server."""
    timeout_seconds: McpSeconds | None = None
    """Per call (default: the dispatcher's for the class)."""
    startup_timeout_seconds: McpSeconds = 30.0
    """Start + initialize + tools/list."""
    cancel_grace_seconds: McpSeconds = 3.0
    """After notifications/cancelled, before the process is killed."""
    tools: dict[ToolName, McpToolOverride] = Field(default_factory=dict)
    """By the MCP server's own tool name."""


class McpServerConfig(McpServerSpec):
    """One stdio MCP server, validated, with its name."""

    name: ServerName

    @property
    def where(self) -> str:
        return f"mcp_servers.{self.name}"

    def tool_name(self, tool: str) -> str:
        return f"mcp_{self.name}_{tool}"

    def side_effect_of(self, tool: str) -> SideEffect:
        override = self.tools.get(tool)
        if override is not None and override.side_effect is not None:
            return override.side_effect
        return self.side_effect

    def always_prompt_of(self, tool: str) -> bool:
        override = self.tools.get(tool)
        if override is not None and override.always_prompt is not None:
            return override.always_prompt
        return self.always_prompt


McpServers = dict[ServerName, McpServerSpec]
"""The whole ``mcp_servers:`` section."""


def parse_mcp_servers(value: Any) -> tuple[McpServerConfig, ...]:
    """Validate the ``mcp_servers:`` mapping.

    Raises:
        ConfigError: naming the offending key.
    """
    if value is None:
        return ()
    return named(validate_section(McpServers, value, "mcp_servers"))


def named(specs: Mapping[str, McpServerSpec]) -> tuple[McpServerConfig, ...]:
    """Each validated server with its name (the key it was given under)."""
    return tuple(McpServerConfig.model_validate({**dict(spec), "name": name}) for name, spec in specs.items())
