"""write_file and patch_file through the local agent: atomicity, modes, matches, escapes, races."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.patch import patched
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.sandbox.local import LocalSandbox
from dispatcher.tools.patch_file import PatchFileTool
from dispatcher.tools.write_file import WriteFileTool
from tests.unit.tools.conftest import Harness, text_of


async def test_write_creates_parents_and_reports(harness: Harness, workspace: Path) -> None:
    output = await harness.run(WriteFileTool(), path="src/pkg/mod.py", content="a = 1\nb = 2\n")
    assert (workspace / "src/pkg/mod.py").read_text() == "a = 1\nb = 2\n"
    assert text_of(output) == "Wrote 2 lines (12 bytes) to src/pkg/mod.py"
    assert output.files_modified == ["src/pkg/mod.py"]


async def test_write_keeps_mode_and_leaves_no_temp_files(harness: Harness, workspace: Path) -> None:
    script = workspace / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    await harness.run(WriteFileTool(), path="./run.sh", content="#!/bin/sh\necho hi\n")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert script.read_text() == "#!/bin/sh\necho hi\n"
    assert [p.name for p in workspace.iterdir()] == ["run.sh"]


@pytest.mark.parametrize("path", ["../outside/x.txt", "link_out/x.txt", "link_out/new/x.txt", "secret_link"])
async def test_write_escapes_are_refused(harness: Harness, workspace: Path, outside: Path, path: str) -> None:
    (workspace / "link_out").symlink_to(outside)
    (workspace / "secret_link").symlink_to(outside / "secret.txt")
    with pytest.raises(WorkspaceEscapeError):
        await harness.run(WriteFileTool(), path=path, content="pwned")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


async def test_write_onto_a_directory_fails(harness: Harness, workspace: Path) -> None:
    (workspace / "d").mkdir()
    with pytest.raises(FileOpError) as info:
        await harness.run(WriteFileTool(), path="d", content="x")
    assert info.value.code == "EISDIR"


async def test_patch_replaces_the_single_occurrence(harness: Harness, workspace: Path) -> None:
    target = workspace / "m.py"
    target.write_text("def f():\n    return 1\n")
    target.chmod(0o640)
    output = await harness.run(
        PatchFileTool(), path="m.py", old="    return 1\n", new="    x = 1\n    return x\n"
    )
    assert target.read_text() == "def f():\n    x = 1\n    return x\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert output.files_modified == ["m.py"] and "Patched m.py" in text_of(output)


async def test_patch_without_match_explains_and_changes_nothing(harness: Harness, workspace: Path) -> None:
    (workspace / "m.py").write_text("x = 1\n")
    with pytest.raises(FileOpError) as info:
        await harness.run(PatchFileTool(), path="m.py", old="x = 2", new="x = 3")
    assert info.value.code == "no_match" and "not found" in info.value.message
    assert (workspace / "m.py").read_text() == "x = 1\n"


async def test_patch_with_several_matches_explains_and_changes_nothing(
    harness: Harness, workspace: Path
) -> None:
    (workspace / "m.py").write_text("x = 1\nx = 1\nx = 1\n")
    with pytest.raises(FileOpError) as info:
        await harness.run(PatchFileTool(), path="m.py", old="x = 1", new="y")
    assert info.value.code == "multiple_matches"
    assert "3 times" in info.value.message and "exactly once" in info.value.message
    assert (workspace / "m.py").read_text() == "x = 1\nx = 1\nx = 1\n"
    assert [p.name for p in workspace.iterdir()] == ["m.py"]


async def test_patch_missing_file_and_escape(harness: Harness, workspace: Path, outside: Path) -> None:
    with pytest.raises(FileOpError) as info:
        await harness.run(PatchFileTool(), path="nope.py", old="a", new="b")
    assert info.value.code == "ENOENT"
    (workspace / "s").symlink_to(outside / "secret.txt")
    with pytest.raises(WorkspaceEscapeError):
        await harness.run(PatchFileTool(), path="s", old="secret", new="public")
    assert (outside / "secret.txt").read_text() == "top secret\n"


async def test_patch_matches_crlf_lines_with_lf_and_writes_crlf(harness: Harness, workspace: Path) -> None:
    target = workspace / "win.txt"
    target.write_bytes(b"one\r\ntwo\r\nthree\r\n")
    await harness.run(PatchFileTool(), path="win.txt", old="one\ntwo\n", new="1\n2\n2b\n")
    assert target.read_bytes() == b"1\r\n2\r\n2b\r\nthree\r\n"


async def test_patch_with_crlf_old_matches_an_lf_file(harness: Harness, workspace: Path) -> None:
    target = workspace / "unix.txt"
    target.write_bytes(b"one\ntwo\n")
    await harness.run(PatchFileTool(), path="unix.txt", old="one\r\ntwo", new="ONE\r\nTWO")
    assert target.read_bytes() == b"ONE\nTWO\n"


async def test_patch_on_mixed_line_endings_says_so(harness: Harness, workspace: Path) -> None:
    target = workspace / "mixed.txt"
    target.write_bytes(b"one\r\ntwo\nthree\r\n")
    with pytest.raises(FileOpError) as info:
        await harness.run(PatchFileTool(), path="mixed.txt", old="one\ntwo\nthree", new="x")
    assert info.value.code == "no_match"
    assert "mixes CRLF" in info.value.message and "not changed" in info.value.message
    assert target.read_bytes() == b"one\r\ntwo\nthree\r\n"


def test_patched_is_the_one_patch_semantics() -> None:
    """What review mode shows and what patch_file writes: both are ``patched``."""
    assert patched(b"a\r\nb\r\n", "a\nb\n", "c\n", "f") == b"c\r\n"  # LF old in a CRLF file
    assert patched(b"x\na\nb\n", "a\r\nb", "A\r\nB", "f") == b"x\nA\nB\n"  # CRLF old in an LF file
    assert patched("é\n".encode(), "é", "e", "f") == b"e\n"
    with pytest.raises(FileOpError, match="occurs 2 times") as info:
        patched(b"x x", "x", "y", "f")
    assert info.value.code == "multiple_matches"
    with pytest.raises(FileOpError, match="`old` was not found in f") as info:
        patched(b"abc", "zzz", "y", "f")
    assert info.value.code == "no_match"
    with pytest.raises(FileOpError) as info:
        patched(b"abc", "\udcff", "y", "f")
    assert info.value.code == "decode"
    tool = PatchFileTool()
    with pytest.raises(FileOpError) as info:
        tool.preview({"path": "f", "old": "a", "new": "b"}, None)
    assert info.value.code == "ENOENT"


class _ChangedAfterRead:
    """The sandbox's files, with something else writing ``target`` just after patch_file read it."""

    def __init__(self, sandbox: LocalSandbox, target: Path) -> None:
        self._sandbox = sandbox
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sandbox, name)

    async def read_bytes(self, path: str, **kw: object) -> bytes:
        data = await self._sandbox.read_bytes(path, **kw)  # type: ignore[arg-type]
        self._target.write_text("changed meanwhile\n")
        return data


async def test_patch_refuses_a_change_made_after_its_read_and_keeps_it(
    harness: Harness, workspace: Path
) -> None:
    """The agent compares what patch_file read with the file just before its rename."""
    target = workspace / "m.py"
    target.write_text("x = 1\n")
    context = replace(harness.context(), workspace_files=_ChangedAfterRead(harness.sandbox, target))
    with pytest.raises(FileOpError) as info:
        await PatchFileTool().execute({"path": "m.py", "old": "x = 1", "new": "x = 2"}, context)
    assert info.value.code == "changed" and "changed while it was being patched" in info.value.message
    assert target.read_text() == "changed meanwhile\n"
    assert [p.name for p in workspace.iterdir()] == ["m.py"]  # no temp file left


# -- replace_all (issue 34, part 3) ----------------------------------------------------------------


async def test_replace_all_replaces_every_occurrence_and_counts_them(
    harness: Harness, workspace: Path
) -> None:
    target = workspace / "m.py"
    target.write_text("x = 1\nprint(x)\nx = 1\nx = 1\n")
    output = await harness.run(PatchFileTool(), path="m.py", old="x = 1", new="y = 2", replace_all=True)
    assert target.read_text() == "y = 2\nprint(x)\ny = 2\ny = 2\n"
    assert output.metadata == {"replacements": 3} and "replaced 3 occurrence(s)" in text_of(output)
    assert output.files_modified == ["m.py"]


async def test_replace_all_of_one_occurrence_and_of_none(harness: Harness, workspace: Path) -> None:
    target = workspace / "m.py"
    target.write_text("alpha beta\n")
    output = await harness.run(PatchFileTool(), path="m.py", old="beta", new="gamma", replace_all=True)
    assert output.metadata == {"replacements": 1} and target.read_text() == "alpha gamma\n"
    with pytest.raises(FileOpError) as info:
        await harness.run(PatchFileTool(), path="m.py", old="delta", new="x", replace_all=True)
    assert info.value.code == "no_match" and target.read_text() == "alpha gamma\n"


async def test_replace_all_false_still_requires_one_and_names_the_option(
    harness: Harness, workspace: Path
) -> None:
    (workspace / "m.py").write_text("a a a\n")
    with pytest.raises(FileOpError) as info:
        await harness.run(PatchFileTool(), path="m.py", old="a", new="b", replace_all=False)
    assert info.value.code == "multiple_matches" and "replace_all" in info.value.message
    assert (workspace / "m.py").read_text() == "a a a\n"


async def test_replace_all_keeps_crlf_in_every_occurrence(harness: Harness, workspace: Path) -> None:
    target = workspace / "win.txt"
    target.write_bytes(b"a\r\nb\r\nx\r\na\r\nb\r\n")
    output = await harness.run(PatchFileTool(), path="win.txt", old="a\nb", new="A\nB", replace_all=True)
    assert target.read_bytes() == b"A\r\nB\r\nx\r\nA\r\nB\r\n" and output.metadata["replacements"] == 2


def test_preview_with_replace_all_is_what_the_tool_writes() -> None:
    tool = PatchFileTool()
    after = tool.preview({"path": "f", "old": "x", "new": "yy", "replace_all": True}, b"x-x-x")
    assert after == b"yy-yy-yy" == patched(b"x-x-x", "x", "yy", "f", replace_all=True)
    with pytest.raises(FileOpError) as info:
        tool.preview({"path": "f", "old": "x", "new": "yy"}, b"x-x-x")
    assert info.value.code == "multiple_matches"
