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

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatcher.core.errors import ConfigError
from dispatcher.core.types import SideEffect

SERVER_NAME_RE = re.compile(r"^[a-z0-9_]{1,32}$")
"""So ``mcp_<server>_<tool>`` stays a valid tool name whatever the server calls its tools."""
MAX_TOOL_NAME = 128
_SERVER_KEYS = frozenset(
    {
        "command",
        "args",
        "env",
        "run",
        "side_effect",
        "always_prompt",
        "timeout_seconds",
        "startup_timeout_seconds",
        "cancel_grace_seconds",
        "tools",
    }
)
_TOOL_KEYS = frozenset({"side_effect", "always_prompt"})
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MAX_ARGS = 256
_MAX_STRING = 4096

RunWhere = Literal["host", "sandbox"]


@dataclass(frozen=True, slots=True)
class McpToolOverride:
    """What the config says about one of a server's tools (None: the server's default)."""

    side_effect: SideEffect | None = None
    always_prompt: bool | None = None


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One stdio MCP server, validated."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    run: RunWhere = "host"
    side_effect: SideEffect = SideEffect.EXECUTE
    """The class of every tool the config does not list: an unknown tool may do anything."""
    always_prompt: bool = False
    timeout_seconds: float | None = None
    startup_timeout_seconds: float = 30.0
    cancel_grace_seconds: float = 3.0
    tools: Mapping[str, McpToolOverride] = field(default_factory=dict)

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


def parse_mcp_servers(value: Any) -> tuple[McpServerConfig, ...]:
    """Validate the ``mcp_servers:`` mapping.

    Raises:
        ConfigError: naming the offending key.
    """
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError("mcp_servers: must be a mapping of server name to its settings")
    return tuple(_server(name, item) for name, item in value.items())


def _server(name: Any, item: Any) -> McpServerConfig:
    if not isinstance(name, str) or not SERVER_NAME_RE.match(name):
        raise ConfigError(
            f"mcp_servers.{name!s:.40}: a server name must match {SERVER_NAME_RE.pattern} "
            "(its tools are named mcp_<server>_<tool>)"
        )
    where = f"mcp_servers.{name}"
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: must be a mapping with at least 'command'")
    unknown = sorted(str(k) for k in item if k not in _SERVER_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_SERVER_KEYS))})")
    command = item.get("command")
    if not isinstance(command, str) or not command or len(command) > _MAX_STRING or "\0" in command:
        raise ConfigError(f"{where}.command: must be a non-empty string (the executable)")
    args = item.get("args", [])
    if not isinstance(args, list) or len(args) > _MAX_ARGS:
        raise ConfigError(f"{where}.args: must be a list of at most {_MAX_ARGS} strings")
    for i, arg in enumerate(args):
        if not isinstance(arg, str) or len(arg) > _MAX_STRING or "\0" in arg:
            raise ConfigError(f"{where}.args[{i}]: must be a string")
    run = item.get("run", "host")
    if run not in ("host", "sandbox"):
        raise ConfigError(f"{where}.run: must be 'host' or 'sandbox', got {run!r}")
    tools_section = item.get("tools") or {}
    if not isinstance(tools_section, Mapping):
        raise ConfigError(f"{where}.tools: must be a mapping of the server's tool names to settings")
    return McpServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=_env(item.get("env"), f"{where}.env"),
        run=run,
        side_effect=_side_effect(item.get("side_effect", "execute"), f"{where}.side_effect"),
        always_prompt=_bool(item.get("always_prompt", False), f"{where}.always_prompt"),
        timeout_seconds=_seconds(item, "timeout_seconds", where, None),
        startup_timeout_seconds=_seconds(item, "startup_timeout_seconds", where, 30.0) or 30.0,
        cancel_grace_seconds=_seconds(item, "cancel_grace_seconds", where, 3.0) or 3.0,
        tools={str(k): _tool(k, v, f"{where}.tools") for k, v in tools_section.items()},
    )


def _tool(name: Any, item: Any, parent: str) -> McpToolOverride:
    if not isinstance(name, str) or not name or len(name) > MAX_TOOL_NAME:
        raise ConfigError(f"{parent}.{name!s:.40}: a tool name must be a string of 1 to {MAX_TOOL_NAME}")
    where = f"{parent}.{name}"
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: must be a mapping (side_effect, always_prompt)")
    unknown = sorted(str(k) for k in item if k not in _TOOL_KEYS)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_TOOL_KEYS))})")
    effect = item.get("side_effect")
    prompt = item.get("always_prompt")
    return McpToolOverride(
        side_effect=None if effect is None else _side_effect(effect, f"{where}.side_effect"),
        always_prompt=None if prompt is None else _bool(prompt, f"{where}.always_prompt"),
    )


def _side_effect(value: Any, where: str) -> SideEffect:
    allowed = ", ".join(e.value for e in SideEffect)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: must be one of {allowed}, got {value!r}")
    try:
        return SideEffect(value.lower())
    except ValueError:
        raise ConfigError(f"{where}: must be one of {allowed}, got {value!r}") from None


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false, got {value!r}")
    return value


def _seconds(item: Mapping[str, Any], key: str, where: str, default: float | None) -> float | None:
    value = item.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86_400:
        raise ConfigError(
            f"{where}.{key}: expected a positive number of seconds (at most 86400), got {value!r}"
        )
    return float(value)


def _env(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a mapping of variable name to string value")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            raise ConfigError(f"{where}.{key!s:.40}: not a valid environment variable name")
        if not isinstance(val, str) or "\0" in val or len(val) > _MAX_STRING * 8:
            raise ConfigError(f"{where}.{key}: the value must be a string")
        out[key] = val
    return out
