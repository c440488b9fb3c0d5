"""Staged writes of review and audit sessions in the core (issue 22, item 5), over the fake sandbox:
the call returns at once, the session's reads see the staged content, a human applies (per file
in review, all or nothing in audit) or discards, and the bounds are the call's error."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dispatcher.core import ConfirmationPolicy, DispatcherConfig, MemoryAuditLog, Session, ToolDispatcher
from dispatcher.core.call.approve import ApprovalMode
from dispatcher.core.errors import UnknownStagedChangeError
from dispatcher.core.events import payloads as ep
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.types import TextBlock, ToolResultBlock, ToolUseBlock
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider
from dispatcher.tools import ListDirTool, PatchFileTool, ReadFileTool, WriteFileTool


def _dispatcher(provider: FakeSandboxProvider, audit: MemoryAuditLog, **config: Any) -> ToolDispatcher:
    d = ToolDispatcher(provider, config=DispatcherConfig(**config), audit=audit, policy=ConfirmationPolicy())
    for tool in (WriteFileTool, PatchFileTool, ReadFileTool, ListDirTool):
        d.register(tool)
    return d


def _text(result: ToolResultBlock) -> str:
    block = result.content[0]
    assert isinstance(block, TextBlock)
    return block.text


async def _call(
    d: ToolDispatcher, session: Session, name: str, tool_input: dict[str, Any]
) -> ToolResultBlock:
    return await d.dispatch(ToolUseBlock(f"{name}-{len(tool_input)}", name, tool_input), session, turn_id="t")


@pytest.fixture
def reviewing(session: Session) -> Session:
    return replace(session, approval_mode=ApprovalMode.REVIEW)


async def test_a_staged_write_returns_at_once_and_the_sessions_reads_see_it(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, reviewing: Session
) -> None:
    d = _dispatcher(provider, audit)
    disk = provider.sandbox_for(reviewing)
    await disk.write_bytes("notes.txt", b"one\ntwo\n")
    written = await _call(d, reviewing, "write_file", {"path": "src/new.py", "content": "x = 1\n"})
    assert not written.is_error and "not yet on disk" in _text(written)
    assert written.metadata["staged"].startswith("stg_") and written.files_modified == ()
    patched = await _call(d, reviewing, "patch_file", {"path": "./notes.txt", "old": "two", "new": "TWO"})
    assert not patched.is_error, _text(patched)
    assert disk.files == {"/workspace/notes.txt": b"one\ntwo\n"}  # nothing on disk yet

    read = await _call(d, reviewing, "read_file", {"path": "notes.txt"})
    assert _text(read) == "one\nTWO\n"
    read_new = await _call(d, reviewing, "read_file", {"path": "/workspace/src/new.py"})
    assert _text(read_new) == "x = 1\n"
    listed = await _call(d, reviewing, "list_dir", {})
    assert _text(listed).splitlines()[:2] == ["notes.txt", "src/"]
    assert "[staged, not yet on disk: notes.txt (8 bytes), src/]" in _text(listed)
    in_src = await _call(d, reviewing, "list_dir", {"path": "src"})  # only staged files are there
    assert _text(in_src).startswith("new.py\n[staged, not yet on disk: new.py (6 bytes)]")

    # A second patch of the same file applies over the staged content: still one change.
    again = await _call(d, reviewing, "patch_file", {"path": "notes.txt", "old": "one", "new": "ONE"})
    assert again.metadata["staged"] == patched.metadata["staged"] and "updated" in _text(again)
    changes = d.staged_changes(reviewing.session_id)
    assert [(c.path, c.kind.value) for c in changes] == [("src/new.py", "create"), ("notes.txt", "modify")]
    assert changes[1].data == b"ONE\nTWO\n" and "-one\n-two\n+ONE\n+TWO\n" in changes[1].diff
    assert [r["decision"] for r in audit.records if r.get("tool") in ("write_file", "patch_file")] == [
        "staged"
    ] * 6  # dispatched + completed, per call
    await d.aclose()


async def test_review_applies_per_file_and_refuses_one_changed_underneath(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, reviewing: Session
) -> None:
    d = _dispatcher(provider, audit)
    disk = provider.sandbox_for(reviewing)
    await disk.write_bytes("a.txt", b"a\n")
    await disk.write_bytes("b.txt", b"b\n")
    ids = [
        (await _call(d, reviewing, "write_file", {"path": p, "content": "new\n"})).metadata["staged"]
        for p in ("a.txt", "b.txt")
    ]
    disk.files["/workspace/b.txt"] = b"changed by a command\n"
    async with d.events(reviewing.session_id).subscribe(
        after_seq=d.events(reviewing.session_id).last_seq
    ) as sub:
        outcome = await d.apply_staged(reviewing.session_id, [])
        event = await anext(aiter(sub))
    assert [c.change_id for c in outcome.applied] == [ids[0]]
    (refusal,) = outcome.refused
    assert refusal.change.change_id == ids[1] and "changed on disk" in refusal.reason
    assert disk.files["/workspace/a.txt"] == b"new\n"
    assert disk.files["/workspace/b.txt"] == b"changed by a command\n"  # never overwritten
    assert [c.change_id for c in d.staged_changes(reviewing.session_id)] == [ids[1]]  # still staged
    assert isinstance(event.payload, ep.StagedApplied) and event.tool_use_id == ""
    assert event.payload.change_ids == (ids[0],) and event.payload.refused_ids == (ids[1],)
    (record,) = [r for r in audit.records if r["kind"] == "staged.applied"]
    assert record["applied"] == [{"id": ids[0], "path": "a.txt"}] and record["refused"][0]["id"] == ids[1]
    await d.aclose()


async def test_audit_applies_all_or_nothing(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, session: Session
) -> None:
    d = _dispatcher(provider, audit)
    auditing = replace(session, approval_mode=ApprovalMode.AUDIT)
    disk = provider.sandbox_for(auditing)
    await disk.write_bytes("keep.txt", b"k\n")
    for path in ("new.txt", "keep.txt"):
        assert not (await _call(d, auditing, "write_file", {"path": path, "content": "v2\n"})).is_error
    disk.files["/workspace/keep.txt"] = b"changed\n"
    outcome = await d.apply_staged(auditing.session_id, [])
    assert outcome.applied == () and len(outcome.refused) == 2
    assert "audit mode applies its changes as a whole" in outcome.refused[0].reason
    assert "/workspace/new.txt" not in disk.files  # nothing written, not even the untouched file
    assert len(d.staged_changes(auditing.session_id)) == 2

    discarded = await d.discard_staged(auditing.session_id, [outcome.refused[1].change.change_id])
    assert [c.path for c in discarded] == ["keep.txt"]
    outcome = await d.apply_staged(auditing.session_id, [])
    assert [c.path for c in outcome.applied] == ["new.txt"] and disk.files["/workspace/new.txt"] == b"v2\n"
    assert [r["kind"] for r in audit.records if r["kind"].startswith("staged.")] == [
        "staged.applied",
        "staged.discarded",
        "staged.applied",
    ]
    with pytest.raises(UnknownStagedChangeError):
        await d.discard_staged(auditing.session_id, ["stg_nope"])
    await d.aclose()


async def test_an_audit_write_failing_after_the_check_says_exactly_what_was_written(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The residual window: a file changes between the check and its rename."""
    d = _dispatcher(provider, audit)
    auditing = replace(session, approval_mode=ApprovalMode.AUDIT)
    disk = provider.sandbox_for(auditing)
    ids = [
        (await _call(d, auditing, "write_file", {"path": p, "content": p})).metadata["staged"]
        for p in ("1.txt", "2.txt", "3.txt")
    ]
    real_write = FakeSandbox.write_bytes

    async def racing_write(self: FakeSandbox, path: str, data: bytes, **kw: Any) -> None:
        if path == "2.txt":
            raise FileOpError("changed", "changed just before the rename")
        await real_write(self, path, data, **kw)

    monkeypatch.setattr(FakeSandbox, "write_bytes", racing_write)
    outcome = await d.apply_staged(auditing.session_id, [])
    assert [c.change_id for c in outcome.applied] == ids[:1]
    assert [r.change.change_id for r in outcome.refused] == ids[1:]
    assert "2.txt was created on disk" in outcome.refused[0].reason
    assert f"the batch stopped at {ids[1]} ({ids[0]} written)" in outcome.refused[1].reason
    assert set(disk.files) == {"/workspace/1.txt"}
    assert [c.change_id for c in d.staged_changes(auditing.session_id)] == ids[1:]
    await d.aclose()


async def test_staging_beyond_the_bounds_is_the_calls_error_naming_the_key(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, reviewing: Session
) -> None:
    d = _dispatcher(provider, audit, max_staged_changes=2, max_staged_bytes=1000)
    for path in ("a", "b"):
        assert not (await _call(d, reviewing, "write_file", {"path": path, "content": "x"})).is_error
    third = await _call(d, reviewing, "write_file", {"path": "c", "content": "x"})
    assert third.is_error and "dispatcher.max_staged_changes" in _text(third)
    restaged = await _call(d, reviewing, "write_file", {"path": "a", "content": "y"})  # same file: room
    assert not restaged.is_error
    big = await _call(d, reviewing, "write_file", {"path": "b", "content": "x" * 1000})
    assert big.is_error and "dispatcher.max_staged_bytes" in _text(big)
    assert [c.data for c in d.staged_changes(reviewing.session_id)] == [b"y", b"x"]
    assert provider.sandbox_for(reviewing).files == {}
    await d.aclose()


async def test_a_patch_that_cannot_apply_is_refused_at_staging(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, reviewing: Session
) -> None:
    d = _dispatcher(provider, audit)
    missing = await _call(d, reviewing, "patch_file", {"path": "none.txt", "old": "a", "new": "b"})
    assert missing.is_error and "does not exist" in _text(missing)
    assert d.staged_changes(reviewing.session_id) == []
    await d.aclose()


async def test_a_replace_all_patch_is_staged_as_it_would_be_written(
    provider: FakeSandboxProvider, audit: MemoryAuditLog, reviewing: Session
) -> None:
    d = _dispatcher(provider, audit)
    disk = provider.sandbox_for(reviewing)
    await disk.write_bytes("names.py", b"old_name = 1\nprint(old_name)\n")
    staged = await _call(
        d, reviewing, "patch_file", {"path": "names.py", "old": "old_name", "new": "new", "replace_all": True}
    )
    assert not staged.is_error, _text(staged)
    assert disk.files == {"/workspace/names.py": b"old_name = 1\nprint(old_name)\n"}  # not on disk yet
    (change,) = d.staged_changes(reviewing.session_id)
    assert change.data == b"new = 1\nprint(new)\n"
    refused = await _call(d, reviewing, "patch_file", {"path": "names.py", "old": "new", "new": "x"})
    assert refused.is_error and "occurs 2 times" in _text(refused)
    await d.aclose()
