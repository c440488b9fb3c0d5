"""README's Policy section documents every policy key and preset, and its example is a valid config."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from dispatcher.core.policy import _ALLOWED_KEYS, PRESETS, ConfirmationPolicy, Mode
from dispatcher.core.types import SideEffect

README = Path(__file__).resolve().parents[2] / "README.md"


def _policy_section() -> str:
    text = README.read_text()
    start = text.index("## Policy")
    return text[start : text.index("\n## ", start + 1)]


def test_every_policy_key_preset_and_mode_is_documented() -> None:
    section = _policy_section()
    for key in _ALLOWED_KEYS:
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
    policy = ConfirmationPolicy.from_config(yaml.safe_load(example)["tool_confirmation"])
    assert policy.default[SideEffect.WRITE] is Mode.PROMPT  # `default:` adjusts the preset
    assert policy.default[SideEffect.READ] is Mode.AUTO
    assert policy.per_tool["shell"] is Mode.PROMPT_ONCE
