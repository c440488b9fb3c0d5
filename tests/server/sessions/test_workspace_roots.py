"""Tenant workspace roots never overlap each other or the server's own state (issue 7, point 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import hash_token
from dispatcher.config.load import load_config
from dispatcher.core.errors import ConfigError
from dispatcher.sandbox.container.config import SandboxConfig


def _load(tmp_path: Path, roots: list[str | None]) -> Any:
    tenants: list[dict[str, Any]] = []
    for i, root in enumerate(roots):
        tenant: dict[str, Any] = {"id": f"t{i}", "token_sha256": hash_token(f"token-{i}")}
        if root is not None:
            tenant["workspace_root"] = root
        tenants.append(tenant)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "tenants": tenants}))
    return load_config(path, env={})


@pytest.mark.parametrize(
    ("roots", "message"),
    [
        (["{tmp}/ws/a", "{tmp}/ws/a/b"], "tenants[1].workspace_root: .* inside .* tenant 't0'"),
        (["{tmp}/ws/a/b", "{tmp}/ws/a"], "tenants[0].workspace_root: .* inside .* tenant 't1'"),
        (["{tmp}/same", "{tmp}/same"], "tenants[0].workspace_root: .* inside \\(or equal to\\)"),
        (["{tmp}", None], "tenants[0].workspace_root: .* holds the server's home"),
        (["volumes", None], "tenants[0].workspace_root: .* overlaps the server's state"),
        (["run/mounts", None], "tenants[0].workspace_root: .* overlaps the server's state"),
    ],
)
def test_overlapping_roots_are_refused(tmp_path: Path, roots: list[str | None], message: str) -> None:
    filled = [r.format(tmp=tmp_path) if r is not None else None for r in roots]
    with pytest.raises(ConfigError, match=message.replace("[", "\\[").replace("]", "\\]")):
        _load(tmp_path, filled)


def test_a_root_reached_through_a_symlink_counts_as_its_target(tmp_path: Path) -> None:
    (tmp_path / "ws" / "a").mkdir(parents=True)
    (tmp_path / "alias").symlink_to(tmp_path / "ws" / "a")
    with pytest.raises(ConfigError, match="tenant 't0'"):
        _load(tmp_path, [str(tmp_path / "ws"), str(tmp_path / "alias" / "inner")])


def test_separate_roots_and_the_defaults_are_accepted(tmp_path: Path) -> None:
    config = _load(tmp_path, [str(tmp_path / "ws" / "a"), str(tmp_path / "ws" / "ab"), None, "custom"])
    assert [t.workspace_root.name for t in config.tenants] == ["a", "ab", "t2", "custom"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 10 << 30), ("64m", 64 << 20), (0, None), ("null", None)],
)
def test_workspace_quota_setting(value: Any, expected: int | None) -> None:
    section = {} if value is None else {"workspace_quota": None if value == "null" else value}
    assert SandboxConfig.from_mapping(section).workspace_quota == expected


def test_workspace_quota_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"sandbox\.workspace_quota"):
        SandboxConfig.from_mapping({"workspace_quota": "lots"})
    with pytest.raises(ConfigError, match=r"sandbox\.workspace_quota_mode"):
        SandboxConfig.from_mapping({"workspace_quota_mode": "maybe"})
