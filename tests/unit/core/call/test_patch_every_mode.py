"""One patch semantics (issue 19, item 4): the same patch_file call does the same thing in every
approval mode. The case that once split them: ``old`` written with CRLF in an LF file, which
patch_file applies (the other line ending) and review mode's staging used to refuse as not found.
In review and audit modes the call stages its change, and the change applied is the same."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from dispatcher.core import ConfirmationPolicy, Decision, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.call.approve import ApprovalMode, approve_plan
from dispatcher.core.errors import ToolRegistrationError
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolOutput, ToolResultBlock
from dispatcher.sandbox.fake import FakeSandboxProvider
from dispatcher.tools import PatchFileTool, WriteFileTool
from tests.blocks import text_at
from tests.events import ToolConfirmationRequested, is_event
from tests.unit.core.toolkit import OBJ, definition

BEFORE = b"x\na\nb\n"
CRLF_PATCH = {"path": "f.txt", "old": "a\r\nb", "new": "A\r\nB"}
AFTER = b"x\nA\nB\n"


async def _dispatch_allowing(d: ToolDispatcher, session: Session, use: ToolUseBlock) -> ToolResultBlock:
    """Dispatch ``use``, accepting every question it asks (none in some modes); the session is
    opened here (idempotent), so its history replays a question asked before the subscription."""
    async with d.open_session(session).subscribe() as sub:

        async def allow_all() -> None:
            async for event in sub:
                if is_event(event, ToolConfirmationRequested):
                    d.resolve_confirmation(session.session_id, event.payload.request_id, Decision.ALLOW)

        answerer = asyncio.create_task(allow_all())
        try:
            return await d.dispatch(use, session, turn_id="t")
        finally:
            answerer.cancel()


@pytest.mark.parametrize("mode", list(ApprovalMode))
async def test_a_crlf_old_patches_an_lf_file_in_every_mode(
    provider: FakeSandboxProvider, session: Session, mode: ApprovalMode
) -> None:
    # patch_file's preview() and the file API's patch are core/patch.py's: one semantics
    # (tests/unit/tools/test_file_api_patch.py holds them to the same answers).
    d = ToolDispatcher(provider, policy=ConfirmationPolicy())
    d.register(WriteFileTool)
    d.register(PatchFileTool)
    moded = replace(session, approval_mode=mode)
    sandbox = provider.sandbox_for(moded)
    await sandbox.write_bytes("f.txt", BEFORE)
    use = ToolUseBlock("p", "patch_file", dict(CRLF_PATCH))
    result = await _dispatch_allowing(d, moded, use)
    if mode is ApprovalMode.PLAN:  # proposed, not run; once the plan is approved it runs unasked
        assert result.is_error and "plan mode" in text_at(result)
        assert await sandbox.read_bytes("f.txt") == BEFORE
        approve_plan(d.session_state(session.session_id), allow=True)
        result = await _dispatch_allowing(d, moded, replace(use, id="p2"))
    assert not result.is_error, result.content
    if mode in (ApprovalMode.REVIEW, ApprovalMode.AUDIT):  # staged: on disk once a human applies it
        assert await sandbox.read_bytes("f.txt") == BEFORE and result.metadata["staged"]
        outcome = await d.apply_staged(session.session_id, [result.metadata["staged"]])
        assert [c.path for c in outcome.applied] == ["f.txt"] and not outcome.refused
    else:
        assert result.files_modified == ("f.txt",)
    assert await sandbox.read_bytes("f.txt") == AFTER
    await d.aclose()


class Upcase:
    """A user tool nobody in the core knows by name: it offers preview(), so review mode stages it."""

    definition = definition(
        "upcase",
        SideEffect.WRITE,
        input_schema={**OBJ, "properties": {"file": {"type": "string"}}, "required": ["file"]},
        requires_fs=(("file", "rw"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        current = await context.workspace_files.read_bytes(input["file"])
        new = self.preview(input, current)
        await context.workspace_files.write_bytes(input["file"], new)
        return ToolOutput([TextBlock("ok")], files_modified=[input["file"]])

    def preview(self, input: Mapping[str, Any], current: bytes | None) -> bytes:
        return (current or b"").upper()

    async def cancel(self) -> bool:
        return False


async def test_review_stages_any_tool_that_previews_by_its_rw_path(
    provider: FakeSandboxProvider, session: Session
) -> None:
    d = ToolDispatcher(provider, policy=ConfirmationPolicy.preset("autonomous"))
    d.register(Upcase)
    reviewing = replace(session, approval_mode=ApprovalMode.REVIEW)
    sandbox = provider.sandbox_for(reviewing)
    await sandbox.write_bytes("u.txt", b"quiet\n")
    result = await d.dispatch(ToolUseBlock("u", "upcase", {"file": "u.txt"}), reviewing)
    assert not result.is_error and "not yet on disk" in text_at(result)
    (change,) = d.staged_changes(session.session_id)
    assert "-quiet\n+QUIET\n" in change.diff and change.change_id == result.metadata["staged"]
    assert await sandbox.read_bytes("u.txt") == b"quiet\n"  # staged, not written
    await d.apply_staged(session.session_id, [])
    assert await sandbox.read_bytes("u.txt") == b"QUIET\n"
    await d.aclose()


def test_a_tool_that_previews_must_name_one_file() -> None:
    class TwoFiles(Upcase):
        definition = replace(Upcase.definition, requires_fs=(("file", "rw"), ("file", "rw")))

    class NoFile(Upcase):
        definition = replace(Upcase.definition, requires_fs=(("file", "r"),))

    for factory in (TwoFiles, NoFile):
        with pytest.raises(ToolRegistrationError, match="a preview is of exactly one file"):
            ToolDispatcher(FakeSandboxProvider()).register(factory)
