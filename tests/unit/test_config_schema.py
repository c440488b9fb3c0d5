"""The config file's JSON Schema: committed, what ``dispatcher config-schema`` prints, in agreement with
the loader, and the README's YAML examples are valid under both. Also ``dispatcher config-check``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from dispatcher.cli import main
from dispatcher.config.file import config_schema
from dispatcher.config.load import load_config
from dispatcher.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO / "docs" / "config.schema.json"
TOKEN_HASH = "0" * 64


def _validator() -> Draft202012Validator:
    schema = config_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _load(tmp_path: Path, data: Any) -> Any:
    path = tmp_path / "server.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return load_config(path, home=str(tmp_path / "home"), env={})


def test_the_committed_schema_is_what_config_schema_prints(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config-schema"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed)["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert SCHEMA_FILE.read_text() == printed, (
        "docs/config.schema.json is stale: python3 -m dispatcher.cli config-schema > docs/config.schema.json"
    )


def test_every_key_is_described() -> None:
    """What an editor shows on hover: each key's own text, or its section's for a nested section."""
    schema = config_schema()
    models = {"root": schema, **schema["$defs"]}

    def section_described(prop: dict[str, Any]) -> bool:
        refs = [prop.get("$ref")] + [p.get("$ref") for p in prop.get("anyOf", [])]
        names = [r.rsplit("/", 1)[1] for r in refs if r]
        return any("description" in schema["$defs"][n] for n in names)

    undescribed = [
        f"{name}.{key}"
        for name, model in models.items()
        for key, prop in model.get("properties", {}).items()
        if "description" not in prop and not section_described(prop)
    ]
    assert not undescribed, undescribed


def _readme_yaml_blocks() -> list[str]:
    return re.findall(r"```ya?ml\n(.*?)```", (REPO / "README.md").read_text(), re.S)


@pytest.mark.parametrize("index", range(len(_readme_yaml_blocks())))
def test_a_readme_yaml_example_is_valid_for_the_schema_and_the_loader(tmp_path: Path, index: int) -> None:
    example = yaml.safe_load(_readme_yaml_blocks()[index])
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in _validator().iter_errors(example)]
    assert not errors, errors
    _load(tmp_path, example)  # the loader takes it as well


GOOD: list[dict[str, Any]] = [
    {},
    {"server": None, "sandbox": None, "tenants": [{"id": "a", "token_sha256": TOKEN_HASH, "quotas": None}]},
    {"log": {"level": "DEBUG", "format": "text"}},
    {"tool_confirmation": {"preset": "manual", "default": {"write": "AUTO", "EXECUTE": "deny"}}},
    {"sandbox": {"mem_limit": "1g", "cap_drop": "ALL", "idle_ttl_seconds": 30, "workspace_quota": None}},
    {"sandbox": {"backend": "local"}},
    {"tenants": [{"id": "a", "token_sha256": TOKEN_HASH, "uid": 300000, "approval_modes": ["review"]}]},
    {"timeouts": {"shell": 1800, "read_file": 7.5}},
    {
        "mcp_servers": {
            "notes": {"command": "notes-mcp", "side_effect": "READ", "tools": {"x": {"always_prompt": True}}}
        }
    },
    {"metrics": {"listen": "127.0.0.1:9464"}, "shutdown": {"remove_sessions": True}},
]
BAD: list[tuple[dict[str, Any], str]] = [
    ({"colour": "red"}, "colour"),
    ({"listen": "nowhere"}, "listen"),
    ({"server": {"max_message_bytes": 0}}, "server.max_message_bytes"),
    ({"server": {"grace_seconds": "10"}}, "server.grace_seconds"),
    ({"log": {"level": "loud"}}, "log.level"),
    ({"sandbox": {"pids_limit": "many"}}, "sandbox.pids_limit"),
    ({"sandbox": {"read_only": 1}}, "sandbox.read_only"),
    ({"tool_confirmation": {"default": {"WRITE": "maybe"}}}, "tool_confirmation.default.WRITE"),
    ({"tool_confirmation": {"default": {"WRITES": "auto"}}}, "tool_confirmation.default.WRITES"),
    ({"timeouts": {"shell": 0}}, "timeouts.shell"),
    ({"timeouts": {"shell": 10**9}}, "timeouts.shell"),
    ({"tenants": [{"id": "a b", "token_sha256": TOKEN_HASH}]}, "tenants[0].id"),
    ({"tenants": [{"id": "a", "token_sha256": "abc"}]}, "tenants[0].token_sha256"),
    ({"tenants": [{"id": "a", "token_sha256": TOKEN_HASH, "uid": 0}]}, "tenants[0].uid"),
    (
        {"tenants": [{"id": "a", "token_sha256": TOKEN_HASH, "approval_modes": ["yolo"]}]},
        "tenants[0].approval_modes",
    ),
    ({"mcp_servers": {"Bad": {"command": "x"}}}, "mcp_servers.Bad"),
    ({"mcp_servers": {"ok": {"command": "x", "run": "cloud"}}}, "mcp_servers.ok.run"),
    ({"metrics": {"port": 1}}, "metrics.port"),
]


@pytest.mark.parametrize("data", GOOD)
def test_what_the_loader_takes_the_schema_takes(tmp_path: Path, data: dict[str, Any]) -> None:
    _load(tmp_path, data)
    assert not list(_validator().iter_errors(data))


@pytest.mark.parametrize(("data", "key"), BAD)
def test_what_the_loader_refuses_naming_the_key_the_schema_refuses(
    tmp_path: Path, data: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, data)
    assert str(err.value).startswith(key), str(err.value)
    assert list(_validator().iter_errors(data)), f"the schema takes {data}"


def test_every_bad_key_of_a_file_is_named_on_its_own_line(tmp_path: Path) -> None:
    data = {"server": {"max_message_bytes": -1}, "sandbox": {"imagee": "x"}, "log": {"format": "xml"}}
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, data)
    lines = str(err.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "log.format",
        "server.max_message_bytes",
        "sandbox.imagee",
    ]
    assert "unknown key (allowed: agent_path, agent_python," in lines[2] and " backend," in lines[2]


def test_config_check_says_valid_or_exits_2_naming_each_bad_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"tenants": [{"id": "a", "token_sha256": TOKEN_HASH}]}))
    assert main(["config-check", str(good)]) == 0
    assert "valid (1 tenant(s), sandbox backend docker)" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "tenants": [
                    {"id": "a", "token_sha256": TOKEN_HASH},
                    {"id": "b", "token_sha256": TOKEN_HASH},  # a check across tenants the schema cannot make
                ]
            }
        )
    )
    assert main(["config-check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "tenants[1].token_sha256: token already belongs to another tenant" in err
    unloadable = tmp_path / "tools.yaml"
    unloadable.write_text(
        yaml.safe_dump({"tools": ["tests.server.tools:make_echo_tool", "no.such.module:x"]})
    )
    assert main(["config-check", str(unloadable)]) == 2  # imported as serve would
    assert "tools[1]: cannot load" in capsys.readouterr().err
