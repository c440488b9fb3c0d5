"""``config-check`` reads past the keys that fail their own validation: they are reported, and the
rest of the file is checked without them (removed from their mapping, never renumbering a list)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dispatcher.config.file import ConfigFile
from dispatcher.config.load import load_config
from dispatcher.config.salvage import salvage

TENANT = {"id": "a", "token_sha256": "a" * 64}


def test_a_failing_key_is_removed_from_its_mapping_not_its_list() -> None:
    data: dict[str, Any] = {
        "timeouts": {"shell": -1, "read_file": 5},
        "tenants": [
            {**TENANT, "fs": [{"path": "src"}, {"path": "../etc"}]},
            {**TENANT, "id": "b", "tools": ["x"]},
        ],
    }
    file = salvage(ConfigFile, data)
    assert file is not None
    assert file.timeouts == {"read_file": 5}
    assert [t.id for t in file.tenants] == ["a", "b"]  # the second tenant is still tenants[1]
    assert file.tenants[1].tools == ("x",) and file.tenants[0].fs is None
    assert data["tenants"][0]["fs"][1] == {"path": "../etc"}  # the caller's data is left alone


def test_nothing_is_salvaged_when_the_tool_names_sources_fail() -> None:
    assert salvage(ConfigFile, {"tools": [5], "timeouts": {"x": 1}}) is None
    assert salvage(ConfigFile, {"mcp_servers": {"notes": {"command": 5}}}) is None


def test_load_with_problems_reports_the_failing_keys_once_and_returns_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"sandbox": {"backend": "local"}, "timeouts": {"shell": -1, "nope": 5}}))
    problems: list[str] = []
    config = load_config(path, env={}, problems=problems)
    assert len(problems) == 1 and problems[0].startswith("timeouts.shell:")
    assert config.dispatcher.timeouts == {"nope": 5}  # its name is checked next, in the same run
