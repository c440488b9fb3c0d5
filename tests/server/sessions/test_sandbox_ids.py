"""Who a tenant's sandboxes run as when nothing else says, and who owns the workspaces made for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.config.load import TenantConfig
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy
from dispatcher.server.tenancy.tenants import (
    DefaultIds,
    TenantDirectory,
    default_sandbox_ids,
    resolve_workspace,
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


@root_only
def test_the_owner_of_the_workspace_root_is_the_default(tmp_path: Path) -> None:
    os.chown(tmp_path, 4321, 4322)
    assert default_sandbox_ids(None, (1000, 1000)).for_root(tmp_path) == (4321, 4322)


@root_only
def test_a_root_owned_workspace_root_keeps_the_configured_user(tmp_path: Path) -> None:
    os.chown(tmp_path, 0, 0)
    assert default_sandbox_ids(None, (1000, 1000)).for_root(tmp_path) == (1000, 1000)


@root_only
def test_a_configured_sandbox_user_wins_over_the_owner(tmp_path: Path) -> None:
    os.chown(tmp_path, 4321, 4321)
    assert default_sandbox_ids("2345:2345", (2345, 2345)).for_root(tmp_path) == (2345, 2345)


def test_a_missing_root_will_be_the_servers(tmp_path: Path) -> None:
    ids = DefaultIds(configured=(1000, 1000), follow_owner=True).for_root(tmp_path / "missing")
    assert ids == ((1000, 1000) if os.geteuid() == 0 else (os.geteuid(), os.getegid() or os.geteuid()))


@root_only
def test_workspaces_are_made_owned_by_the_sandbox_user_and_nothing_is_reowned(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    os.chown(root, 0, 0)
    (root / "old").mkdir()  # made by someone else, root-owned: stays so
    directory = TenantDirectory(
        [TenantConfig("default", (), root)],
        ConfirmationPolicy(),
        default_ids=default_sandbox_ids(None, (1000, 1000)),
    )
    tenant = directory.get("default")
    assert (tenant.uid, tenant.gid) == (1000, 1000)
    resolve_workspace(tenant, "a/b")
    resolve_workspace(tenant, "old/c")
    for made in ("a", "a/b", "old/c"):
        st = (root / made).stat()
        assert (st.st_uid, st.st_gid) == (1000, 1000), made
    assert (root / "old").stat().st_uid == 0
    assert root.stat().st_uid == 0
