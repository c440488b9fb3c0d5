"""list_dir through the local agent: markers, bounds, errors, escapes."""

from __future__ import annotations

import os
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


# -- names are escaped: one entry, one line (issue 7, point 13) ------------------------------------


async def test_a_newline_in_a_name_cannot_forge_an_entry(harness: Harness, workspace: Path) -> None:
    (workspace / "a\nid_rsa@ -> ..").write_text("x")
    (workspace / "b").write_text("x")
    output = await harness.run(ListDirTool())
    assert text_of(output).split("\n") == ["a\\nid_rsa@ -> ..", "b"]
    assert output.metadata["entries"] == 2


async def test_backslashes_are_doubled_so_an_escape_cannot_be_forged(
    harness: Harness, workspace: Path
) -> None:
    (workspace / "a\\nb").write_text("x")  # a real backslash, then n: not a newline
    (workspace / "a\nb").write_text("x")
    assert text_of(await harness.run(ListDirTool())).split("\n") == ["a\\nb", "a\\\\nb"]


async def test_bidi_and_control_characters_are_shown_escaped(harness: Harness, workspace: Path) -> None:
    (workspace / "invoice\u202efdp.exe").write_text("x")
    (workspace / "bell\x07\x1b[2J").mkdir()
    (workspace / "tab\tlink").symlink_to("to\rhere")
    text = text_of(await harness.run(ListDirTool()))
    assert text.split("\n") == ["bell\\x07\\x1b[2J/", "invoice\\u202efdp.exe", "tab\\tlink@ -> to\\rhere"]


async def test_names_that_are_not_utf8_show_their_bytes_escaped(harness: Harness, workspace: Path) -> None:
    os.mkdir(os.fsencode(workspace) + b"/caf\xe9")
    os.mkdir(os.fsencode(workspace) + b"/caf\xe8")
    text = text_of(await harness.run(ListDirTool()))
    # Two different names, two different lines (U+FFFD for both would make them look the same).
    assert text.split("\n") == ["caf\\udce8/", "caf\\udce9/"]
