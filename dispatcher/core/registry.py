"""The tool registry (spec 000 §3.1, spec 001 merge rules, spec 002 invariants) and schema export."""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from typing import get_args

from jsonschema import Draft7Validator

from dispatcher.core.errors import RegistrySealedError, ToolNameConflictError, ToolRegistrationError
from dispatcher.core.schema import check_schema
from dispatcher.core.tool_shapes import to_anthropic as to_anthropic  # re-exported: the registry's names
from dispatcher.core.tool_shapes import to_mcp as to_mcp
from dispatcher.core.tool_shapes import to_openai as to_openai
from dispatcher.core.types import FsMode, Previewable, Role, SideEffect, Tool, ToolDefinition, ToolFactory

NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True, slots=True)
class RegisteredTool:
    definition: ToolDefinition
    factory: ToolFactory
    validator: Draft7Validator
    builtin: bool
    previews: bool = False
    """Its tools are ``Previewable``: review mode stages their writes as diffs."""


class ToolRegistry:
    """Exact-case, unique names; closed (sealed) once the server serves."""

    def __init__(self) -> None:
        self._tools: dict[str, RegisteredTool] = {}
        self._sealed = False

    @property
    def sealed(self) -> bool:
        return self._sealed

    def seal(self) -> None:
        """Refuse every later register/unregister: the tool set is fixed while serving."""
        self._sealed = True

    def register(self, factory: ToolFactory, *, builtin: bool = False) -> ToolDefinition:
        """Check the factory and its definition, compile the validator, and add the tool.

        Raises:
            RegistrySealedError: the registry is sealed.
            ToolNameConflictError: a user tool takes a built-in tool's name.
            ToolRegistrationError: anything else wrong with the tool.
        """
        if self._sealed:
            raise RegistrySealedError("the tool registry is sealed; tools are fixed while serving")
        if not callable(factory):
            raise ToolRegistrationError(f"register() takes a zero-argument factory, got {factory!r}")
        first, second = _make(factory), _make(factory)
        if first is second:
            raise ToolRegistrationError(
                f"factory for {first.definition.name!r} returned the same object twice; "
                "register a factory that makes a fresh Tool per call, not a singleton"
            )
        definition = first.definition
        _check_definition(definition)
        if second.definition != definition:
            raise ToolRegistrationError(f"factory for {definition.name!r} returns differing definitions")
        existing = self._tools.get(definition.name)
        if existing is not None:
            if existing.builtin and not builtin:
                raise ToolNameConflictError(f"tool {definition.name!r} conflicts with a built-in tool")
            raise ToolRegistrationError(f"tool {definition.name!r} is already registered")
        previews = isinstance(first, Previewable)
        if previews:
            written_input(definition)  # raises if the file it previews is not one input
        validator = check_schema(definition.name, definition.input_schema)
        self._tools[definition.name] = RegisteredTool(definition, factory, validator, builtin, previews)
        return definition

    def unregister(self, name: str) -> None:
        """Remove a tool; unknown names are ignored.

        Raises:
            RegistrySealedError: the registry is sealed.
        """
        if self._sealed:
            raise RegistrySealedError("the tool registry is sealed; tools are fixed while serving")
        self._tools.pop(name, None)

    def get(self, name: str) -> RegisteredTool | None:
        """Exact-case lookup."""
        return self._tools.get(name)

    def list(self) -> list[str]:
        return sorted(self._tools)

    def definitions(self, role: Role = Role.MAIN) -> builtins.list[ToolDefinition]:
        """Definitions visible to a session of ``role``, sorted by name."""
        return [
            self._tools[n].definition
            for n in sorted(self._tools)
            if role is Role.MAIN or not self._tools[n].definition.main_only
        ]

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools


def _make(factory: ToolFactory) -> Tool:
    try:
        tool = factory()
    except Exception as exc:
        raise ToolRegistrationError(f"tool factory {factory!r} raised {exc!r}") from exc
    if not isinstance(getattr(tool, "definition", None), ToolDefinition):
        raise ToolRegistrationError(f"tool factory {factory!r} made an object without a ToolDefinition")
    if not callable(getattr(tool, "execute", None)) or not callable(getattr(tool, "cancel", None)):
        raise ToolRegistrationError(f"tool {tool.definition.name!r} lacks execute() or cancel()")
    return tool


def _check_definition(definition: ToolDefinition) -> None:
    if not isinstance(definition.name, str) or not NAME_RE.match(definition.name):
        raise ToolRegistrationError(f"tool name {definition.name!r} must match {NAME_RE.pattern}")
    if not isinstance(definition.side_effect, SideEffect):
        raise ToolRegistrationError(f"tool {definition.name!r} must declare a SideEffect")
    for key, mode in definition.requires_fs:
        if mode not in get_args(FsMode):
            raise ToolRegistrationError(
                f"tool {definition.name!r}: requires_fs mode for {key!r} must be r, rw or cwd"
            )
        if key not in definition.input_schema.get("properties", {}):
            raise ToolRegistrationError(f"tool {definition.name!r}: requires_fs names unknown input {key!r}")
    if definition.timeout_seconds is not None and definition.timeout_seconds <= 0:
        raise ToolRegistrationError(f"tool {definition.name!r}: timeout_seconds must be positive")


def written_input(definition: ToolDefinition) -> str:
    """The input naming the file a ``Previewable`` tool replaces: its one ``rw`` path.

    Raises:
        ToolRegistrationError: it has no ``rw`` path, or several.
    """
    keys = [key for key, mode in definition.requires_fs if mode == "rw"]
    if len(keys) != 1:
        raise ToolRegistrationError(
            f"tool {definition.name!r} offers preview() but has {len(keys)} rw paths in requires_fs; "
            "a preview is of exactly one file"
        )
    return keys[0]
