"""Confirmation policy by side-effect class (spec 000 §5.2) with the approval presets of spec 004."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

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
_ALLOWED_KEYS = frozenset(
    {"default", "per_tool", "trusted_workspaces", "trusted_workspace_overrides", "preset"}
)


@dataclass(frozen=True, slots=True)
class ConfirmationPolicy:
    """Resolves the mode for one call: per-tool > trusted-workspace rules > class default; deny stays deny."""

    default: Mapping[SideEffect, Mode] = field(default_factory=lambda: dict(_CAUTIOUS))
    per_tool: Mapping[str, Mode] = field(default_factory=dict)
    trusted_workspaces: tuple[str, ...] = ()
    trusted_workspace_overrides: Mapping[SideEffect, Mode] = field(default_factory=dict)

    @classmethod
    def preset(cls, name: str) -> ConfirmationPolicy:
        """The policy of a spec 004 approval mode: ``cautious``, ``autonomous`` or ``manual``.

        Raises:
            ConfigError: unknown preset name.
        """
        if name not in PRESETS:
            raise ConfigError(f"tool_confirmation.preset: unknown preset {name!r} (one of {sorted(PRESETS)})")
        return cls(default=dict(PRESETS[name]))

    @classmethod
    def from_config(
        cls, section: Mapping[str, Any] | None, *, where: str = "tool_confirmation"
    ) -> ConfirmationPolicy:
        """Build from the ``tool_confirmation:`` YAML section; unset classes keep the safe defaults.

        Raises:
            ConfigError: naming the offending key.
        """
        return cls().merged(section, where=where)

    def merged(
        self, section: Mapping[str, Any] | None, *, where: str = "tool_confirmation"
    ) -> ConfirmationPolicy:
        """A copy with ``section`` (same structure as the YAML) laid over this policy."""
        if section is None:
            return self
        if not isinstance(section, Mapping):
            raise ConfigError(f"{where}: must be a mapping")
        unknown = set(section) - _ALLOWED_KEYS
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown key (allowed: {sorted(_ALLOWED_KEYS)})")
        policy = self
        if "preset" in section:
            policy = replace(policy, default=dict(ConfirmationPolicy.preset(str(section["preset"])).default))
        if "default" in section:
            policy = replace(
                policy, default={**policy.default, **_class_modes(section["default"], f"{where}.default")}
            )
        if "per_tool" in section:
            per_tool = _mapping(section["per_tool"], f"{where}.per_tool")
            modes = {str(k): _mode(v, f"{where}.per_tool.{k}") for k, v in per_tool.items()}
            policy = replace(policy, per_tool={**policy.per_tool, **modes})
        if "trusted_workspaces" in section:
            paths = section["trusted_workspaces"] or []
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
                raise ConfigError(f"{where}.trusted_workspaces: must be a list of paths")
            policy = replace(policy, trusted_workspaces=policy.trusted_workspaces + _normalise(paths))
        if "trusted_workspace_overrides" in section:
            overrides = _class_modes(
                section["trusted_workspace_overrides"], f"{where}.trusted_workspace_overrides"
            )
            policy = replace(
                policy, trusted_workspace_overrides={**policy.trusted_workspace_overrides, **overrides}
            )
        return policy

    def is_trusted(self, workspace_path: str) -> bool:
        """True when ``workspace_path`` is, or is inside, a trusted workspace."""
        return bool(self.trusted_workspaces) and _inside_any(workspace_path, self.trusted_workspaces)

    def mode_for(
        self, tool_name: str, side_effect: SideEffect, workspace_path: str, *, always_prompt: bool = False
    ) -> Mode:
        """The mode that applies to one call.

        A per-tool mode wins. Otherwise the class default applies, and a trusted workspace may
        replace it with its override (auto when none) unless the default is ``deny``: trust lowers
        the bar for what would be asked, it never opens what is forbidden.
        """
        if tool_name in self.per_tool:
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


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: must be a mapping")
    return value


def _mode(value: Any, where: str) -> Mode:
    try:
        return Mode(str(value).lower())
    except ValueError:
        raise ConfigError(f"{where}: unknown mode {value!r} (one of {[m.value for m in Mode]})") from None


def _class_modes(value: Any, where: str) -> dict[SideEffect, Mode]:
    out: dict[SideEffect, Mode] = {}
    for key, mode in _mapping(value, where).items():
        try:
            effect = SideEffect(str(key).lower())
        except ValueError:
            raise ConfigError(f"{where}.{key}: unknown side-effect class") from None
        out[effect] = _mode(mode, f"{where}.{key}")
    return out


def _normalise(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(os.path.realpath(os.path.expanduser(p)) for p in paths)
