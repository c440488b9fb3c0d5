"""Each tenant of a ``tenants:`` config runs its sandboxes as its own host uid, stable across restarts."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import hash_token
from dispatcher.config.load import Config, TenantConfig, ensure_default_tenant, load_config
from dispatcher.config.sections import UidRange
from dispatcher.core import ConfirmationPolicy, ToolDispatcher
from dispatcher.core.errors import ConfigError
from dispatcher.core.types import Role
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.fake import FakeSandboxProvider
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.tenancy.tenants import TenantDirectory
from dispatcher.server.tenancy.uids import allocate


def _tenant(tmp: Path, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": name,
        "token_sha256": hash_token(f"{name}-token"),
        "workspace_root": str(tmp / name),
        **extra,
    }


def _load(tmp: Path, tenants: list[dict[str, Any]], **top: Any) -> Config:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp / "home"), "tenants": tenants, **top}))
    return load_config(path, env={})


def _uids(config: Config) -> dict[str, tuple[int | None, int | None]]:
    directory = TenantDirectory(
        config.tenants, config.policy, uid_range=config.tenant_uids, uid_file=config.home / "uids.json"
    )
    return {
        t.tenant_id: (directory.get(t.tenant_id).uid, directory.get(t.tenant_id).gid) for t in config.tenants
    }


def test_tenants_get_distinct_uids_that_survive_restarts_and_reordering(tmp_path: Path) -> None:
    config = _load(tmp_path, [_tenant(tmp_path, "a"), _tenant(tmp_path, "b")])
    first = _uids(config)
    assert first == {"a": (200000, 200000), "b": (200001, 200001)}
    file = tmp_path / "home" / "uids.json"
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert json.loads(file.read_text())["tenants"] == {"a": 200000, "b": 200001}
    # Reordered, one tenant added in front, one removed: the known ones keep theirs, the new one
    # gets a fresh uid, and the removed tenant's uid is never reused.
    again = _load(tmp_path, [_tenant(tmp_path, "c"), _tenant(tmp_path, "b")])
    assert _uids(again) == {"c": (200002, 200002), "b": (200001, 200001)}
    back = _load(tmp_path, [_tenant(tmp_path, "b"), _tenant(tmp_path, "a"), _tenant(tmp_path, "c")])
    assert _uids(back) == {"b": (200001, 200001), "a": (200000, 200000), "c": (200002, 200002)}


def test_explicit_ids_are_used_and_never_collide(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        [
            _tenant(tmp_path, "a", uid=200000),
            _tenant(tmp_path, "b"),
            _tenant(tmp_path, "g", uid=5000, gid=4242),
        ],
        tenant_uids={"start": 200000, "count": 10},
    )
    assert _uids(config) == {"a": (200000, 200000), "b": (200001, 200001), "g": (5000, 4242)}
    # An explicit uid that was handed to another tenant earlier is refused, not shared.
    stolen = _load(tmp_path, [_tenant(tmp_path, "b"), _tenant(tmp_path, "x", uid=200001)])
    with pytest.raises(ConfigError, match="allocated to tenant 'b'"):
        _uids(stolen)


@pytest.mark.parametrize(
    ("tenants", "top", "message"),
    [
        ([{"uid": 0}], {}, "never root"),
        ([{"uid": 7}, {"uid": 7}], {}, "tenants never share"),
        ([{"gid": 7}], {}, "needs a uid"),
        ([{"uid": "1000"}], {}, r"tenants\[0\].uid"),
        ([{}], {"tenant_uids": {"start": 0}}, "never root"),
        ([{}], {"tenant_uids": {"start": 1, "size": 2}}, "tenant_uids.size: unknown key"),
    ],
)
def test_bad_uid_settings_are_refused(
    tmp_path: Path, tenants: list[dict[str, Any]], top: dict[str, Any], message: str
) -> None:
    entries = [_tenant(tmp_path, f"t{i}", **extra) for i, extra in enumerate(tenants)]
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, entries, **top)


def test_a_full_range_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is full"):
        allocate(tmp_path / "uids.json", ["a", "b"], {}, UidRange(start=300, count=1))


def test_the_single_default_tenant_keeps_the_sandbox_user(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home")}))
    config, _ = ensure_default_tenant(load_config(path, env={}))
    assert config.tenant_uids is None
    assert _uids(config) == {"default": (None, None)}
    assert not (tmp_path / "home" / "uids.json").exists()
    assert SandboxConfig().user_for(None, None) == "1000:1000"
    assert SandboxConfig().user_for(200001, 200001) == "200001:200001"
    with pytest.raises(ConfigError):
        SandboxConfig().user_for(0, 0)


async def test_sessions_carry_their_tenants_uid(tmp_path: Path) -> None:
    tenants = [
        TenantConfig("a", (hash_token("a"),), tmp_path / "a"),
        TenantConfig("b", (hash_token("b"),), tmp_path / "b", uid=4000, gid=4001),
    ]
    directory = TenantDirectory(
        tenants, ConfirmationPolicy(), uid_range=UidRange(), uid_file=tmp_path / "home" / "uids.json"
    )
    manager = SessionManager(ToolDispatcher(FakeSandboxProvider()))
    a = manager.create(directory.get("a"), "w", Role.MAIN, {}).session
    b = manager.create(directory.get("b"), "w", Role.MAIN, {}).session
    assert (a.sandbox_uid, a.sandbox_gid) == (200000, 200000)
    assert (b.sandbox_uid, b.sandbox_gid) == (4000, 4001)
