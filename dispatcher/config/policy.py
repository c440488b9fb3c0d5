"""The policy sections of the config file: what a tenant's sessions may do and what is asked first.

``tool_confirmation:`` (spec 000's structure, per approval mode too), the ``approval_modes`` a
session may choose (spec 004) and a tenant's capabilities (spec 003: tools and workspace paths).
The server's and each tenant's share these models; ``dispatcher.config.load`` turns them into the
core's policy layers and capabilities.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from dispatcher.config_base import Section
from dispatcher.core.approval.confirmation_policy import PRESETS, Mode, PolicyLayer
from dispatcher.core.approval.modes import ApprovalMode
from dispatcher.core.blocks import GrantMode
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.types import SideEffect

__all__ = [
    "DEFAULT_APPROVAL_MODES",
    "ApprovalModes",
    "ApprovalModesOrNull",
    "CapabilitiesSection",
    "FsGrantSection",
    "ModeOverrides",
    "ToolConfirmation",
]

DEFAULT_APPROVAL_MODES = (ApprovalMode.CAUTIOUS, ApprovalMode.MANUAL, ApprovalMode.REVIEW, ApprovalMode.PLAN)
"""The modes a session may choose unless ``approval_modes`` says otherwise: those that never run a
call the operator's ``tool_confirmation`` would ask about unasked (spec 000: the config is the
operator's). ``autonomous`` and ``audit`` lower that bar, so the operator lists them."""


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


def _side_effect_key(value: object) -> object:
    names = [e.value for e in SideEffect]
    if not isinstance(value, str) or value.lower() not in names:
        raise ValueError(f"unknown side-effect class (one of {', '.join(n.upper() for n in names)})")
    return value.lower()


_EFFECT_NAMES = tuple(e.value for e in SideEffect) + tuple(e.value.upper() for e in SideEffect)
_MODE_NAMES = tuple(m.value for m in Mode) + tuple(m.value.upper() for m in Mode)
EffectKey = Annotated[
    SideEffect, BeforeValidator(_side_effect_key, json_schema_input_type=Literal[_EFFECT_NAMES])
]
ModeName = Annotated[Mode, BeforeValidator(_lower, json_schema_input_type=Literal[_MODE_NAMES])]


class ModeOverrides(Section):
    """``tool_confirmation.modes.<mode>``: what differs for sessions in that approval mode."""

    per_tool: dict[Annotated[str, Field(strict=True)], ModeName] = Field(default_factory=dict)
    """Per tool name, over ``tool_confirmation.per_tool`` (a class ``deny`` still wins)."""


_APPROVAL_NAMES = tuple(m.value for m in ApprovalMode)
ApprovalModeKey = Annotated[
    ApprovalMode, BeforeValidator(_lower, json_schema_input_type=Literal[_APPROVAL_NAMES])
]


class ToolConfirmation(Section):
    """``tool_confirmation:`` (spec 000's structure): what is asked before a call runs."""

    preset: Literal[tuple(PRESETS)] | None = None  # type: ignore[valid-type]
    """Start from the class defaults of an approval mode: cautious, autonomous or manual."""
    default: dict[EffectKey, ModeName] = Field(default_factory=dict)
    """Per side-effect class (NONE, READ, WRITE, EXECUTE, NETWORK): auto, prompt, prompt_once or deny."""
    per_tool: dict[Annotated[str, Field(strict=True)], ModeName] = Field(default_factory=dict)
    """Per tool name; wins over the class."""
    trusted_workspaces: Annotated[
        tuple[Annotated[str, Field(strict=True)], ...], BeforeValidator(lambda v: [] if v is None else v)
    ] = ()
    """Workspace paths (and everything under them) where ``trusted_workspace_overrides`` apply."""
    trusted_workspace_overrides: dict[EffectKey, ModeName] = Field(default_factory=dict)
    """Per class, in a trusted workspace (default: auto). A class ``deny`` stays deny."""
    always_prompt: Annotated[
        tuple[Annotated[str, Field(strict=True)], ...], BeforeValidator(lambda v: [] if v is None else v)
    ] = ()
    """Tool names (built-in, custom or ``mcp_<server>_<tool>``) that ask on every call, in every
    approval mode, autonomous and audit included; an answer is never remembered for them. Only a
    ``deny`` overrides it. A tenant's list adds to the server's."""
    modes: dict[ApprovalModeKey, ModeOverrides] = Field(default_factory=dict)
    """Per approval mode (``autonomous: {per_tool: {shell: prompt}}``): per-tool modes for sessions
    in that mode, over ``per_tool``; they may loosen or tighten it, but a class ``deny`` stays deny."""

    def layer(self) -> PolicyLayer:
        return PolicyLayer(
            preset=self.preset,
            default=self.default,
            per_tool=self.per_tool,
            trusted_workspaces=self.trusted_workspaces,
            trusted_workspace_overrides=self.trusted_workspace_overrides,
            always_prompt=self.always_prompt,
            modes={str(mode): dict(o.per_tool) for mode, o in self.modes.items()},
        )


def _inside_workspace(path: str) -> str:
    # As Capabilities.of normalises it: a grant over ".." would match no path, so every call of the
    # tenant would fail; say so at start instead.
    norm = posixpath.normpath(path.strip("/") or ".")
    if norm == ".." or norm.startswith("../"):
        raise ValueError(f'{path!r} leaves the workspace; a grant is a path inside it (".": all of it)')
    return path


class FsGrantSection(Section):
    """One workspace path prefix and what a sandbox may do under it."""

    path: Annotated[str, Field(strict=True), AfterValidator(_inside_workspace)]
    """Relative to the workspace ("." is all of it); one leaving it (``../etc``) is an error."""
    mode: GrantMode = "r"
    """``r``: read only; ``rw``: read and write."""


class CapabilitiesSection(Section):
    """What a tenant's sessions may use (spec 003); absent: everything."""

    tools: tuple[Annotated[str, Field(strict=True)], ...] | None = None
    """Allow-list of tool names (omit: every tool; empty: none)."""
    fs: tuple[FsGrantSection, ...] | None = None
    """Workspace paths the tools may touch (omit: the whole workspace)."""

    def capabilities(self) -> Capabilities:
        grants: list[tuple[str, GrantMode]] | None = None
        if self.fs is not None:
            grants = [(g.path, g.mode) for g in self.fs]
        return Capabilities.of(self.tools, grants)


def _modes(value: object) -> object:
    names = [m.value for m in ApprovalMode]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"must be a non-empty list of modes from {names}")
    for i, v in enumerate(value):
        if v not in names:
            raise ValueError(f"unknown approval mode {v!r} (one of {names})")
        if v in value[:i]:
            raise ValueError(f"{v!r} is listed twice")
    return value


ApprovalModes = Annotated[tuple[ApprovalMode, ...], BeforeValidator(_modes)]
"""A non-empty list of approval modes without repeats."""
ApprovalModesOrNull = Annotated[
    tuple[ApprovalMode, ...],
    BeforeValidator(lambda v: _modes([m.value for m in DEFAULT_APPROVAL_MODES] if v is None else v)),
]
"""The top-level list: null is the default."""
