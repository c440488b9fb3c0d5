"""Lexical workspace scoping (spec 000 §5.1)."""

from __future__ import annotations

import pytest

from dispatcher.core import WorkspaceEscapeError
from dispatcher.core.paths import MAX_PATH_CHARS, resolve_workspace_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("README.md", "/workspace/README.md"),
        ("./src//a.py", "/workspace/src/a.py"),
        ("src/../b", "/workspace/b"),
        (".", "/workspace"),
        ("", "/workspace"),
        ("/workspace", "/workspace"),
        ("/workspace/x/../y", "/workspace/y"),
    ],
)
def test_inside(path: str, expected: str) -> None:
    assert resolve_workspace_path(path, "/workspace") == expected


@pytest.mark.parametrize(
    "path",
    [
        "../../etc/passwd",
        "subdir/../../../etc/passwd",
        "sub/../../workspace/x",  # out and back in: refused, .. is resolved during checking
        "/etc/passwd",
        "/workspace/../etc",
        "/workspace-other/x",
        "/",
        "..",
        "a\x00b",
    ],
)
def test_escapes_are_refused_with_the_path_in_the_message(path: str) -> None:
    with pytest.raises(WorkspaceEscapeError) as info:
        resolve_workspace_path(path, "/workspace")
    assert repr(path)[:20] in str(info.value) or "NUL" in str(info.value)


def test_overlong_path_is_refused() -> None:
    with pytest.raises(WorkspaceEscapeError, match="longer than"):
        resolve_workspace_path("a/" * MAX_PATH_CHARS, "/workspace")


def test_host_style_root() -> None:
    assert resolve_workspace_path("/home/u/ws/a", "/home/u/ws") == "/home/u/ws/a"
    with pytest.raises(WorkspaceEscapeError):
        resolve_workspace_path("/home/u/other", "/home/u/ws")
