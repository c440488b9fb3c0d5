"""Capability routing (spec 003): tool allow-lists and filesystem grants."""

from __future__ import annotations

import pytest

from dispatcher.config.load import parse_capabilities
from dispatcher.core import Capabilities, ConfigError, FsGrant


def test_unrestricted_by_default() -> None:
    caps = Capabilities()
    assert caps.check_tool("anything") and caps.check_fs("/workspace/x", "rw", root="/workspace")


def test_fs_grants_by_prefix_and_mode() -> None:
    caps = parse_capabilities({"fs": [{"path": "docs", "mode": "r"}, {"path": "/src/", "mode": "rw"}]})
    assert caps.fs_grants == (FsGrant("docs", "r"), FsGrant("src", "rw"))
    root = "/workspace"
    assert caps.check_fs("/workspace/docs/a.md", "r", root=root)
    assert not caps.check_fs("/workspace/docs/a.md", "rw", root=root)
    assert caps.check_fs("/workspace/src", "rw", root=root)
    assert not caps.check_fs("/workspace/srcx/a", "r", root=root)  # a prefix is a path, not a string
    assert not caps.check_fs("/workspace", "r", root=root)


def test_whole_workspace_grant() -> None:
    caps = parse_capabilities({"fs": [{"path": ".", "mode": "r"}]})
    assert caps.check_fs("/workspace", "r", root="/workspace")
    assert caps.check_fs("/workspace/a/b", "r", root="/workspace")


def test_tool_allow_list() -> None:
    caps = parse_capabilities({"tools": ["read_file"]})
    assert caps.check_tool("read_file") and not caps.check_tool("shell") and not caps.check_tool("READ_FILE")
    assert not parse_capabilities({"tools": []}).check_tool("read_file")


def test_intersect_narrows() -> None:
    tenant = parse_capabilities({"tools": ["a", "b"], "fs": [{"path": "src", "mode": "rw"}]})
    session = parse_capabilities(
        {"tools": ["b", "c"], "fs": [{"path": "src/x", "mode": "rw"}, {"path": "etc"}]}
    )
    both = tenant.intersect(session)
    assert both.allowed_tools == frozenset({"b"})
    assert both.fs_grants == (FsGrant("src/x", "rw"),)
    assert tenant.intersect(None) is tenant


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"tool": []}, "capabilities.tool"),
        ({"tools": "shell"}, "capabilities.tools"),
        ({"fs": [{"path": "a", "mode": "w"}]}, "capabilities.fs[0].mode"),
        ({"fs": [{"mode": "r"}]}, "capabilities.fs[0].path"),
    ],
)
def test_config_errors_name_the_key(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match="^" + key.replace("[", r"\[").replace("]", r"\]")):
        parse_capabilities(section)


def test_one_fs_mode_vocabulary() -> None:
    """A use of a path is a grant's mode or ``cwd``; a grant cannot be ``cwd`` (issue 19)."""
    from typing import get_args

    from dispatcher.core import capabilities, types
    from dispatcher.core.blocks import FsMode, GrantMode

    assert get_args(FsMode) == (*get_args(GrantMode), "cwd") == ("r", "rw", "cwd")
    assert vars(capabilities)["FsMode"] is types.FsMode is FsMode  # the name, not re-exported
    with pytest.raises(ConfigError):
        parse_capabilities({"fs": [{"path": "src", "mode": "cwd"}]})
