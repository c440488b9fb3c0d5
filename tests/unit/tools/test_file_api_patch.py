"""``WorkspaceFileAPI.patch`` for custom tools (spec 000 §5.1): a tool written against the file API
patches exactly as ``patch_file`` does, because both are ``core/patch.py``'s (issue 37, item 5)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core import ConfirmationPolicy, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.staging.area import ChangeKind, StagedChange, StagingArea
from dispatcher.core.staging.files import StagedFiles
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolOutput, ToolResultBlock
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider
from dispatcher.tools import PatchFileTool
from tests.blocks import text_at
from tests.unit.core.toolkit import OBJ, definition

STR = {"type": "string"}


class SetVersion:
    """A user's tool: it knows the file API, not patch_file, and edits with ``patch``."""

    definition = definition(
        "set_version",
        SideEffect.WRITE,
        input_schema={
            **OBJ,
            "properties": {"path": STR, "old": STR, "new": STR},
            "required": ["path", "old", "new"],
        },
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        await context.workspace_files.patch(input["path"], input["old"], input["new"])
        return ToolOutput([TextBlock(f"set in {input['path']}")], files_modified=[input["path"]])

    async def cancel(self) -> bool:
        return False


@pytest.fixture
async def setup() -> Any:
    provider = FakeSandboxProvider()
    d = ToolDispatcher(provider, policy=ConfirmationPolicy.preset("autonomous"))
    d.register(SetVersion)
    d.register(PatchFileTool)
    session = Session("s1", "/workspace")
    d.open_session(session)
    yield d, session, provider.sandbox_for(session)
    await d.aclose()


async def _call(d: ToolDispatcher, session: Session, tool: str, **tool_input: str) -> ToolResultBlock:
    return await d.dispatch(ToolUseBlock(f"tu_{tool}_{tool_input['path']}", tool, tool_input), session)


async def test_a_custom_tool_patches_through_the_file_api(setup: Any) -> None:
    d, session, sandbox = setup
    await sandbox.write("pkg/version.py", "VERSION = '1.0'\nNAME = 'x'\n")
    result = await _call(d, session, "set_version", path="pkg/version.py", old="'1.0'", new="'1.1'")
    assert not result.is_error, text_at(result)
    assert await sandbox.read("pkg/version.py") == "VERSION = '1.1'\nNAME = 'x'\n"


CASES = {
    "once": (b"a = 1\nb = 2\n", "b = 2", "b = 3"),
    "lf old in a crlf file": (b"x\r\na\r\nb\r\n", "a\nb", "A\nB"),
    "crlf old in an lf file": (b"x\na\nb\n", "a\r\nb", "A\r\nB"),
    "twice": (b"x = 1\nx = 1\n", "x = 1", "x = 2"),
    "nowhere": (b"x = 1\n", "y = 1", "y = 2"),
    "mixed endings": (b"one\r\ntwo\nthree\r\n", "one\ntwo\nthree", "x"),
}


@pytest.mark.parametrize("before, old, new", CASES.values(), ids=CASES.keys())
async def test_the_file_api_patches_as_patch_file_does(setup: Any, before: bytes, old: str, new: str) -> None:
    d, session, sandbox = setup
    for path in ("by_tool.txt", "by_api.txt"):
        await sandbox.write_bytes(path, before)
    builtin = await _call(d, session, "patch_file", path="by_tool.txt", old=old, new=new)
    custom = await _call(d, session, "set_version", path="by_api.txt", old=old, new=new)
    assert await sandbox.read_bytes("by_api.txt") == await sandbox.read_bytes("by_tool.txt")
    assert custom.is_error is builtin.is_error and custom.error_class is builtin.error_class
    if builtin.is_error:  # the same clear words, naming the file
        assert text_at(custom) == text_at(builtin).replace("by_tool.txt", "by_api.txt")
        assert "was not changed" in text_at(custom) and await sandbox.read_bytes("by_api.txt") == before


async def test_patch_errors_say_what_is_wrong_and_leave_the_file(setup: Any) -> None:
    _, _, sandbox = setup
    files: FakeSandbox = sandbox
    await files.write("f.txt", "x x\n")
    with pytest.raises(FileOpError, match="occurs 2 times") as info:
        await files.patch("f.txt", "x", "y")
    assert info.value.code == "multiple_matches"
    with pytest.raises(FileOpError, match=r"`old` was not found in f\.txt") as info:
        await files.patch("f.txt", "z", "y")
    assert info.value.code == "no_match"
    with pytest.raises(FileOpError) as info:
        await files.patch("missing.txt", "x", "y")
    assert info.value.code == "ENOENT"
    assert await files.read("f.txt") == "x x\n"


async def test_the_api_replaces_all_when_asked_and_says_how_many(setup: Any) -> None:
    _, _, sandbox = setup
    files: FakeSandbox = sandbox
    await files.write("f.txt", "x x\nx\n")
    assert await files.patch("f.txt", "x", "yz", replace_all=True) == 3
    assert await files.read("f.txt") == "yz yz\nyz\n"
    assert await files.patch("f.txt", "yz yz", "w") == 1


async def test_a_change_made_after_the_read_is_refused_and_kept(setup: Any) -> None:
    _, _, sandbox = setup
    files: FakeSandbox = sandbox
    await files.write("f.txt", "x = 1\n")
    read = files.read_bytes

    async def read_then_someone_writes(path: str, **kw: Any) -> bytes:
        data = await read(path, **kw)
        await files.write("f.txt", "changed meanwhile\n")
        return data

    files.read_bytes = read_then_someone_writes  # type: ignore[method-assign]
    with pytest.raises(FileOpError, match="changed while it was being patched") as info:
        await files.patch("f.txt", "x = 1", "x = 2")
    assert info.value.code == "changed"
    assert await read("f.txt") == b"changed meanwhile\n"


async def test_through_a_view_with_staged_changes_patch_is_a_write_to_the_disk() -> None:
    sandbox = FakeSandbox()
    await sandbox.write("f.txt", "on disk\n")
    area = StagingArea("s1")
    staged = StagedChange("c1", "f.txt", ChangeKind.MODIFY, "base", b"staged\n", "", 0.0, "patch_file", "tu")
    await area.put(staged)
    view = StagedFiles(sandbox, area)
    await view.patch("f.txt", "on disk", "patched")  # as its write_bytes: the disk's file, not the staged one
    assert await sandbox.read("f.txt") == "patched\n" and await view.read("f.txt") == "staged\n"
