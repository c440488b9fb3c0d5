"""Confirmation policy by side-effect class (spec 000 §5.2) with the approval presets of spec 004."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from dispatcher.core.blocks import SideEffect
from dispatcher.core.errors import ConfigError


class Mode(StrEnum):
    """What to do before running a call."""

    AUTO = "auto"
    PROMPT = "prompt"
    PROMPT_ONCE = "prompt_once"  # ask once per tool per session; the answer is remembered
    DENY = "deny"


# Conservative default of spec 000: anything that changes the world asks first.
_CAUTIOUS: Mapping[SideEffect, Mode] = {
    SideEffect.NONE: Mode.AUTO,
    SideEffect.READ: Mode.AUTO,
    SideEffect.WRITE: Mode.PROMPT,
    SideEffect.EXECUTE: Mode.PROMPT,
    SideEffect.NETWORK: Mode.PROMPT,
}
PRESETS: Mapping[str, Mapping[SideEffect, Mode]] = {
    "cautious": _CAUTIOUS,
    "autonomous": {effect: Mode.AUTO for effect in SideEffect},
    # "user approves every step, even read-only ones": NONE tools too (issue 10).
    "manual": {effect: Mode.PROMPT for effect in SideEffect},
}


@dataclass(frozen=True, slots=True)
class PolicyLayer:
    """What one ``tool_confirmation:`` section lays over a policy (the config layer parses it).

    The preset, if any, replaces the class defaults first; the other fields are added on top.
    """

    preset: str | None = None
    default: Mapping[SideEffect, Mode] = field(default_factory=dict)
    per_tool: Mapping[str, Mode] = field(default_factory=dict)
    trusted_workspaces: tuple[str, ...] = ()
    trusted_workspace_overrides: Mapping[SideEffect, Mode] = field(default_factory=dict)
    always_prompt: tuple[str, ...] = ()
    modes: Mapping[str, Mapping[str, Mode]] = field(default_factory=dict)
    """Per approval mode name: ``per_tool`` entries for sessions in that mode (spec 004's
    ``modeToolPermissions``)."""


@dataclass(frozen=True, slots=True)
class ConfirmationPolicy:
    """Resolves the mode for one call: the session mode's per-tool override > per-tool >
    trusted-workspace rules > class default; deny stays deny; an always-prompt tool asks."""

    default: Mapping[SideEffect, Mode] = field(default_factory=lambda: dict(_CAUTIOUS))
    per_tool: Mapping[str, Mode] = field(default_factory=dict)
    trusted_workspaces: tuple[str, ...] = ()
    trusted_workspace_overrides: Mapping[SideEffect, Mode] = field(default_factory=dict)
    always_prompt: frozenset[str] = frozenset()
    """Tools that ask on every call, in every approval mode, never remembered (spec 004
    ``alwaysRequireApproval``, set by the operator for any tool)."""
    modes: Mapping[str, Mapping[str, Mode]] = field(default_factory=dict)
    """``tool_confirmation.modes``: per approval mode, per-tool modes over ``per_tool``."""
    in_mode: Mapping[str, Mode] = field(default_factory=dict)
    """The per-tool overrides of the approval mode in force (``approval.mode_policy`` sets them):
    they win over ``per_tool``, loosening or tightening it, but never open a class the policy
    denies."""

    @classmethod
    def preset(cls, name: str) -> ConfirmationPolicy:
        """The policy of a spec 004 approval mode: ``cautious``, ``autonomous`` or ``manual``.

        Raises:
            ConfigError: unknown preset name.
        """
        if name not in PRESETS:
            raise ConfigError(f"tool_confirmation.preset: unknown preset {name!r} (one of {sorted(PRESETS)})")
        return cls(default=dict(PRESETS[name]))

    def merged(self, layer: PolicyLayer | None) -> ConfirmationPolicy:
        """A copy with ``layer`` laid over this policy (a tenant's over the server's)."""
        if layer is None:
            return self
        policy = self
        if layer.preset is not None:
            policy = replace(policy, default=dict(ConfirmationPolicy.preset(layer.preset).default))
        return replace(
            policy,
            default={**policy.default, **layer.default},
            per_tool={**policy.per_tool, **layer.per_tool},
            trusted_workspaces=policy.trusted_workspaces + _normalise(layer.trusted_workspaces),
            trusted_workspace_overrides={
                **policy.trusted_workspace_overrides,
                **layer.trusted_workspace_overrides,
            },
            always_prompt=policy.always_prompt | frozenset(layer.always_prompt),
            modes={
                mode: {**policy.modes.get(mode, {}), **layer.modes.get(mode, {})}
                for mode in {*policy.modes, *layer.modes}
            },
        )

    def asks_always(self, tool_name: str) -> bool:
        """Whether the operator made ``tool_name`` ask on every call."""
        return tool_name in self.always_prompt

    def is_trusted(self, workspace_path: str) -> bool:
        """True when ``workspace_path`` is, or is inside, a trusted workspace."""
        return bool(self.trusted_workspaces) and _inside_any(workspace_path, self.trusted_workspaces)

    def mode_for(
        self, tool_name: str, side_effect: SideEffect, workspace_path: str, *, always_prompt: bool = False
    ) -> Mode:
        """The mode that applies to one call.

        The approval mode's per-tool override wins, unless the tool's class is denied; then a
        per-tool mode. Otherwise the class default applies, and a trusted workspace may replace it
        with its override (auto when none) unless the default is ``deny``: trust lowers the bar for
        what would be asked, it never opens what is forbidden. A tool that always asks (its
        definition's ``always_prompt`` or the policy's) is never ``auto`` nor ``prompt_once``.
        """
        always_prompt = always_prompt or tool_name in self.always_prompt
        if tool_name in self.in_mode:
            mode = self.in_mode[tool_name]
            if self.default.get(side_effect) is Mode.DENY:
                mode = Mode.DENY
        elif tool_name in self.per_tool:
            mode = self.per_tool[tool_name]
        else:
            mode = self.default.get(side_effect, Mode.PROMPT)
            if mode is not Mode.DENY and self.is_trusted(workspace_path):
                mode = self.trusted_workspace_overrides.get(side_effect, Mode.AUTO)
        if always_prompt and mode in (Mode.AUTO, Mode.PROMPT_ONCE):
            return Mode.PROMPT  # nothing lowers an always-prompt tool, not even a remembered answer
        return mode


@functools.lru_cache(maxsize=4096)
def _inside_any(workspace_path: str, trusted: tuple[str, ...]) -> bool:
    # Cached: realpath costs a syscall per path component and this runs on every call.
    path = os.path.realpath(os.path.expanduser(workspace_path))
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in trusted)


def _normalise(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(os.path.realpath(os.path.expanduser(p)) for p in paths)
