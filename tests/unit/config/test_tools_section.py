"""``tools:``: a plain list of custom tool factories, or a mapping with them (``custom``) and the
built-in tools' settings (``shell: {persist: ...}``), each error naming its key as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config.load import load_config
from dispatcher.core.errors import ConfigError
from dispatcher.core.registry import ToolRegistry
from dispatcher.server.config_check import register_tools


def _load(tmp_path: Path, data: Any) -> Any:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path, env={})


def test_the_shell_persists_by_default_and_a_plain_list_is_the_custom_tools(tmp_path: Path) -> None:
    config = _load(tmp_path, {"tools": ["tests.server.tools:make_echo_tool"]})
    assert config.shell_persist and config.custom_tools == ("tests.server.tools:make_echo_tool",)
    assert load_config(None, env={}).shell_persist


def test_the_mapping_form_sets_the_shells_persistence(tmp_path: Path) -> None:
    config = _load(
        tmp_path, {"tools": {"custom": ["tests.server.tools:make_echo_tool"], "shell": {"persist": False}}}
    )
    assert not config.shell_persist and config.custom_tools == ("tests.server.tools:make_echo_tool",)
    registry = ToolRegistry()
    assert register_tools(config, registry) == []
    shell = registry.get("shell")
    assert shell is not None and shell.factory().persist is False  # type: ignore[attr-defined]
    assert "echo" in registry and "process_output" in registry


def test_run_codes_contexts_are_bounded_as_configured(tmp_path: Path) -> None:
    default = load_config(None, env={})
    assert (default.code_contexts, default.code_idle_seconds) == (4, 1800.0)
    config = _load(tmp_path, {"tools": {"run_code": {"max_contexts": 2, "idle_seconds": 60}}})
    registry = ToolRegistry()
    assert register_tools(config, registry) == []
    run_code = registry.get("run_code")
    assert run_code is not None
    tool = run_code.factory()
    assert (tool.max_contexts, tool.idle_seconds) == (2, 60)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("tools", "key"),
    [
        (["no_colon"], "tools[0]"),
        ({"custom": ["no_colon"]}, "tools.custom[0]"),
        ({"shell": {"persist": "yes"}}, "tools.shell.persist"),
        ({"shell": {"remember": True}}, "tools.shell.remember"),
        ({"grep": {}}, "tools.grep"),
        ({"run_code": {"max_contexts": 0}}, "tools.run_code.max_contexts"),
        ({"run_code": {"idle_seconds": -1}}, "tools.run_code.idle_seconds"),
    ],
)
def test_errors_name_the_key_as_written(tmp_path: Path, tools: Any, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, {"tools": tools})
    assert f"{key}:" in str(err.value), str(err.value)
