"""Confirmation policy: spec 000's YAML structure and defaults, spec 004's presets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.config.load import parse_policy, parse_policy_layer
from dispatcher.core import ConfigError, ConfirmationPolicy, Mode, SideEffect


def test_conservative_defaults() -> None:
    p = ConfirmationPolicy()
    modes = {e: p.mode_for("t", e, "/w") for e in SideEffect}
    assert modes == {
        SideEffect.NONE: Mode.AUTO,
        SideEffect.READ: Mode.AUTO,
        SideEffect.WRITE: Mode.PROMPT,
        SideEffect.EXECUTE: Mode.PROMPT,
        SideEffect.NETWORK: Mode.PROMPT,
    }


def test_spec_example_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    project = tmp_path / "code" / "myproject"
    project.mkdir(parents=True)
    p = parse_policy(
        {
            "default": {
                "NONE": "auto",
                "READ": "auto",
                "WRITE": "prompt",
                "EXECUTE": "prompt",
                "NETWORK": "prompt",
            },
            "per_tool": {"git_status": "auto", "npm_install": "prompt"},
            "trusted_workspaces": ["~/code/myproject"],
            "trusted_workspace_overrides": {"EXECUTE": "prompt"},
        }
    )
    assert p.trusted_workspaces == (os.path.realpath(project),)  # ~ expanded
    assert p.mode_for("git_status", SideEffect.EXECUTE, "/elsewhere") is Mode.AUTO
    assert p.mode_for("write_file", SideEffect.WRITE, "/elsewhere") is Mode.PROMPT
    inside = str(project / "sub")
    assert p.mode_for("write_file", SideEffect.WRITE, inside) is Mode.AUTO  # trust lowers the bar
    assert p.mode_for("shell", SideEffect.EXECUTE, inside) is Mode.PROMPT  # except where overridden
    assert p.mode_for("npm_install", SideEffect.EXECUTE, inside) is Mode.PROMPT  # per_tool wins
    assert p.mode_for("x", SideEffect.WRITE, str(tmp_path / "code" / "myproject2")) is Mode.PROMPT


def test_presets() -> None:
    assert ConfirmationPolicy.preset("autonomous").mode_for("t", SideEffect.NETWORK, "/w") is Mode.AUTO
    manual = ConfirmationPolicy.preset("manual")
    assert manual.mode_for("t", SideEffect.READ, "/w") is Mode.PROMPT
    assert manual.mode_for("t", SideEffect.NONE, "/w") is Mode.PROMPT  # issue 10: NONE asks too
    assert ConfirmationPolicy.preset("cautious") == ConfirmationPolicy()
    assert (
        parse_policy({"preset": "autonomous", "default": {"write": "deny"}}).mode_for(
            "t", SideEffect.WRITE, "/w"
        )
        is Mode.DENY
    )


def test_always_prompt_is_never_lowered() -> None:
    p = ConfirmationPolicy.preset("autonomous").merged(
        parse_policy_layer({"per_tool": {"switch_backend": "auto"}})
    )
    assert p.mode_for("switch_backend", SideEffect.NONE, "/w", always_prompt=True) is Mode.PROMPT
    denied = parse_policy({"per_tool": {"x": "deny"}})
    assert denied.mode_for("x", SideEffect.NONE, "/w", always_prompt=True) is Mode.DENY


def test_merged_overrides_per_tenant() -> None:
    base = parse_policy({"per_tool": {"a": "auto"}})
    tenant = base.merged(parse_policy_layer({"per_tool": {"b": "deny"}, "default": {"READ": "prompt"}}))
    assert tenant.per_tool == {"a": Mode.AUTO, "b": Mode.DENY}
    assert tenant.mode_for("r", SideEffect.READ, "/w") is Mode.PROMPT
    assert base.mode_for("r", SideEffect.READ, "/w") is Mode.AUTO


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"defaults": {}}, "tool_confirmation.defaults"),
        ({"default": {"WRITES": "auto"}}, "tool_confirmation.default.WRITES"),
        ({"default": {"WRITE": "sometimes"}}, "tool_confirmation.default.WRITE"),
        ({"per_tool": {"x": "maybe"}}, "tool_confirmation.per_tool.x"),
        ({"per_tool": ["x"]}, "tool_confirmation.per_tool"),
        ({"trusted_workspaces": "~/x"}, "tool_confirmation.trusted_workspaces"),
        ({"preset": "yolo"}, "tool_confirmation.preset"),
        ("auto", "tool_confirmation"),
    ],
)
def test_errors_name_the_bad_key(section: object, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(section)
    assert str(info.value).startswith(key + ":")


@pytest.mark.parametrize("effect", [SideEffect.WRITE, SideEffect.EXECUTE, SideEffect.NETWORK])
def test_trusted_workspace_never_lifts_a_class_deny(tmp_path: Path, effect: SideEffect) -> None:
    p = parse_policy({"default": {effect.value: "deny"}, "trusted_workspaces": [str(tmp_path)]})
    assert p.mode_for("t", effect, str(tmp_path / "sub")) is Mode.DENY
    with_override = p.merged(parse_policy_layer({"trusted_workspace_overrides": {effect.value: "auto"}}))
    assert with_override.mode_for("t", effect, str(tmp_path)) is Mode.DENY


def test_trusted_workspace_never_lifts_a_per_tool_deny(tmp_path: Path) -> None:
    p = ConfirmationPolicy.preset("autonomous").merged(
        parse_policy_layer(
            {
                "per_tool": {"shell": "deny"},
                "trusted_workspaces": [str(tmp_path)],
                "trusted_workspace_overrides": {"EXECUTE": "auto"},
            }
        )
    )
    assert p.mode_for("shell", SideEffect.EXECUTE, str(tmp_path)) is Mode.DENY


@pytest.mark.parametrize("asked", ["prompt", "prompt_once"])
def test_trusted_workspace_lowers_prompt_to_its_override_or_auto(tmp_path: Path, asked: str) -> None:
    p = parse_policy(
        {
            "default": {"WRITE": asked, "EXECUTE": asked, "NETWORK": asked},
            "trusted_workspaces": [str(tmp_path)],
            "trusted_workspace_overrides": {"EXECUTE": "prompt_once"},
        }
    )
    inside = str(tmp_path)
    assert p.mode_for("w", SideEffect.WRITE, inside) is Mode.AUTO
    assert p.mode_for("n", SideEffect.NETWORK, inside) is Mode.AUTO
    assert p.mode_for("x", SideEffect.EXECUTE, inside) is Mode.PROMPT_ONCE
    assert p.mode_for("w", SideEffect.WRITE, str(tmp_path.parent)) is Mode(asked)
