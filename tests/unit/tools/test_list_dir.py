"""list_dir through the local agent: markers, bounds, errors, escapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.tools.list_dir import MAX_ENTRIES, ListDirTool
from tests.unit.tools.conftest import Harness, text_of


async def test_lists_root_with_markers(harness: Harness, workspace: Path) -> None:
    (workspace / "src").mkdir()
    (workspace / "README.md").write_text("hi")
    (workspace / "latest").symlink_to("src")
    output = await harness.run(ListDirTool())
    assert text_of(output) == "README.md\nlatest@ -> src\nsrc/"
    assert output.metadata == {"entries": 3, "truncated": False}


async def test_lists_a_subdirectory_and_an_empty_one(harness: Harness, workspace: Path) -> None:
    (workspace / "a/b").mkdir(parents=True)
    assert text_of(await harness.run(ListDirTool(), path="a")) == "b/"
    assert text_of(await harness.run(ListDirTool(), path="a/b")) == "[empty directory]"


async def test_listing_is_bounded_with_a_marker(harness: Harness, workspace: Path) -> None:
    for i in range(MAX_ENTRIES + 20):
        (workspace / f"f{i:04d}").touch()
    output = await harness.run(ListDirTool(), path=".")
    lines = text_of(output).splitlines()
    assert len(lines) == MAX_ENTRIES + 1 and lines[0] == "f0000"
    assert "truncated" in lines[-1] and output.metadata["truncated"] is True


async def test_listing_a_file_or_missing_dir_fails(harness: Harness, workspace: Path) -> None:
    (workspace / "f").write_text("x")
    with pytest.raises(FileOpError) as info:
        await harness.run(ListDirTool(), path="f")
    assert info.value.code == "ENOTDIR"
    with pytest.raises(FileOpError) as info:
        await harness.run(ListDirTool(), path="nope")
    assert info.value.code == "ENOENT"


@pytest.mark.parametrize("path", ["..", "/", "/etc", "out", "/proc/self/root/etc"])
async def test_escapes_are_refused(harness: Harness, workspace: Path, outside: Path, path: str) -> None:
    (workspace / "out").symlink_to(outside)
    with pytest.raises(WorkspaceEscapeError):
        await harness.run(ListDirTool(), path=path)
