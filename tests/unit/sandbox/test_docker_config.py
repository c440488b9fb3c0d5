"""SandboxConfig: hardened defaults, and from_mapping errors that name the bad key."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.errors import ConfigError
from dispatcher.sandbox.container.config import SandboxConfig, parse_size


def test_defaults_are_the_hardened_ones() -> None:
    cfg = SandboxConfig()
    assert cfg.network_mode == "none"
    assert cfg.cap_drop == ("ALL",) and cfg.cap_add == ()
    assert cfg.no_new_privileges and cfg.read_only and cfg.init
    assert cfg.user == "1000:1000" and cfg.uid == 1000 and cfg.gid == 1000
    assert cfg.pids_limit >= 128 and cfg.runtime is None


def test_from_mapping_converts_yaml_values() -> None:
    cfg = SandboxConfig.from_mapping(
        {
            "image": "custom:1",
            "mem_limit": "1g",
            "cap_drop": ["all"],
            "runtime": "runsc",
            "pids_limit": 200,
            "idle_ttl_seconds": 30,
            "tmpfs_size": "128m",
            "extra_labels": {"team": "ml"},
        }
    )
    assert cfg.image == "custom:1" and cfg.mem_limit == 1 << 30 and cfg.cap_drop == ("ALL",)
    assert cfg.idle_ttl_seconds == 30.0 and cfg.extra_labels == {"team": "ml"}
    assert SandboxConfig.from_mapping(None) == SandboxConfig()


@pytest.mark.parametrize(
    "section, key",
    [
        ({"imagee": "x"}, "sandbox.imagee"),
        ({"user": "root"}, "sandbox.user"),
        ({"user": "0:0"}, "sandbox.user"),
        ({"runtime": "runsc", "pids_limit": 64}, "sandbox.pids_limit"),
        ({"pids_limit": "many"}, "sandbox.pids_limit"),
        ({"pids_limit": True}, "sandbox.pids_limit"),
        ({"mem_limit": "lots"}, "sandbox.mem_limit"),
        ({"mem_limit": "1m"}, "sandbox.mem_limit"),
        ({"read_only": "yes"}, "sandbox.read_only"),
        ({"idle_ttl_seconds": 0}, "sandbox.idle_ttl_seconds"),
        ({"tmpfs_size": "big"}, "sandbox.tmpfs_size"),
        ({"cap_drop": [1]}, r"sandbox.cap_drop\[0\]"),
        ({"extra_labels": {"dispatcher.session": "x"}}, "sandbox.extra_labels"),
        ({"agent_path": "agent.pyz"}, "sandbox.agent_path"),
    ],
)
def test_from_mapping_names_the_bad_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}:"):
        SandboxConfig.from_mapping(section)


def test_from_mapping_refuses_a_non_mapping() -> None:
    with pytest.raises(ConfigError, match=r"^sandbox:"):
        SandboxConfig.from_mapping(["image"])  # type: ignore[arg-type]


def test_parse_size() -> None:
    assert parse_size("512m") == 512 << 20
    assert parse_size("64K") == 64 << 10
    assert parse_size(4096) == 4096
    for bad in (0, True, "lots", "-1m", None):
        with pytest.raises(ConfigError):
            parse_size(bad)


def test_every_bad_key_is_named_on_its_own_line_and_an_unknown_key_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        SandboxConfig.from_mapping({"pids_limit": 0, "imagee": "x", "mem_limit": "1m"})
    lines = str(info.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "sandbox.pids_limit",
        "sandbox.mem_limit",
        "sandbox.imagee",
    ], lines
    assert "unknown key (allowed: agent_path, agent_python," in lines[2]
    assert "must be at least 16m" in lines[1]
