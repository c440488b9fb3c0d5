"""README's Policy section documents every policy key and preset, and its example is a valid config."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from dispatcher.config.load import parse_policy, parse_timeouts
from dispatcher.config.policy import ToolConfirmation
from dispatcher.core.approval.confirmation_policy import PRESETS, ConfirmationPolicy, Mode
from dispatcher.core.call.approve import ApprovalMode, mode_policy
from dispatcher.core.call.settings import DispatcherConfig
from dispatcher.core.call.timeouts import MAX_TIMEOUT_SECONDS
from dispatcher.core.types import SideEffect

README = Path(__file__).resolve().parents[2] / "README.md"
PROTO = (README.parent / "proto" / "dispatcher" / "v1" / "dispatcher.proto").read_text()


def _policy_section() -> str:
    text = README.read_text()
    start = text.index("## Policy")
    return text[start : text.index("\n## ", start + 1)]


def test_every_policy_key_preset_and_mode_is_documented() -> None:
    section = _policy_section()
    for key in ToolConfirmation.model_fields:
        assert f"**`{key}`**" in section, key
    for preset in PRESETS:
        assert f"`{preset}` —" in section, preset
    for mode in Mode:
        assert f"`{mode.value}`" in section, mode
    for effect in SideEffect:
        assert effect.value.upper() in section, effect
    assert "stays `deny`" in section  # trust only lowers what would be asked


def test_the_documented_example_is_a_valid_policy() -> None:
    (example,) = re.findall(r"```yaml\n(tool_confirmation:.*?)```", _policy_section(), re.S)
    policy = parse_policy(yaml.safe_load(example)["tool_confirmation"])
    assert policy.default[SideEffect.WRITE] is Mode.PROMPT  # `default:` adjusts the preset
    assert policy.default[SideEffect.READ] is Mode.AUTO
    assert policy.per_tool["shell"] is Mode.PROMPT_ONCE


def test_every_approval_mode_has_its_row_and_the_session_keys_are_documented() -> None:
    section = _policy_section()
    for mode in ApprovalMode:
        assert re.search(rf"^\| `{mode.value}`( \(default\))? \|", section, re.M), mode
        assert f"APPROVAL_MODE_{mode.name}" in PROTO, mode
    for needle in (
        "approval_mode",
        "capabilities",
        "ApprovePlan",
        "ResolveConfirmations",
        "tool.step_proposed",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "remembered deny refuses later calls of that tool",
        "reason `remembered`",
        "**`timeouts:`**",
        "**`dispatcher.default_timeout`** (60 s)",
        "**`dispatcher.execute_timeout`** (600 s)",
    ):
        assert needle in section, needle
    defaults = DispatcherConfig()
    assert (defaults.default_timeout, defaults.execute_timeout) == (60.0, 600.0)
    assert f"(0, {MAX_TIMEOUT_SECONDS:g}]" in section


def test_the_documented_timeouts_example_is_valid() -> None:
    (example,) = re.findall(r"```yaml\n(timeouts:.*?)```", _policy_section(), re.S)
    assert parse_timeouts(yaml.safe_load(example)["timeouts"])["shell"] == 1800.0


def test_the_mode_table_matches_the_policy_it_applies() -> None:
    base = ConfirmationPolicy()
    for name, expected in (("autonomous", Mode.AUTO), ("audit", Mode.AUTO), ("manual", Mode.PROMPT)):
        policy = mode_policy(base, name)
        assert all(policy.mode_for("t", e, "/w") is expected for e in SideEffect), name
    for name in ("cautious", "plan", "review"):
        assert mode_policy(base, name) == base, name
    denying = parse_policy({"default": {"EXECUTE": "deny"}})
    assert mode_policy(denying, "autonomous").mode_for("shell", SideEffect.EXECUTE, "/w") is Mode.DENY
