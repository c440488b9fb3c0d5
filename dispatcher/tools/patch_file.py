"""``patch_file {path, old, new}``: replace text that occurs exactly once, atomically."""

from __future__ import annotations

from typing import Any

from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import PATH_SCHEMA, FileTool, explain, start, workspace_path


class PatchFileTool(FileTool):
    """Edits a workspace file str_replace-style."""

    definition = ToolDefinition(
        name="patch_file",
        description=(
            "Replace one exact piece of text in a file. `old` must occur exactly once in the file, "
            "matching it character for character (whitespace and indentation included); include "
            "enough surrounding lines to make it unique. The file is unchanged if it does not match. "
            "In a file with CRLF line endings, write `old` and `new` with plain newlines: they "
            "match the CRLF lines and the replacement is written with CRLF."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": PATH_SCHEMA,
                "old": {"type": "string", "minLength": 1, "description": "The exact text to replace."},
                "new": {"type": "string", "description": "The text to put in its place."},
            },
            "required": ["path", "old", "new"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.WRITE,
        requires_fs=(("path", "rw"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Apply the replacement or explain why it could not be applied."""
        start(context)
        path: str = input["path"]
        old: str = input["old"]
        new: str = input["new"]
        approved = context.resolved.get("path")  # where it really was when confirmed: used exactly
        try:
            await _patch_any_newline(context, path, old, new, approved)
        except FileOpError as exc:
            if exc.code == "no_match":
                raise FileOpError(
                    "no_match",
                    f"`old` was not found in {path}. It must match the file exactly, including "
                    "whitespace and indentation; read the file again and copy the text. "
                    f"{await _newline_note(context, path, old, approved)}The file was not changed.",
                ) from exc
            if exc.code == "multiple_matches":
                raise FileOpError(
                    "multiple_matches",
                    f"{exc.message}. `old` must occur exactly once; include more surrounding lines "
                    "to make it unique. The file was not changed.",
                ) from exc
            raise explain(exc, path) from exc
        removed, added = old.count("\n") + 1, new.count("\n") + 1
        return ToolOutput(
            content=[TextBlock(f"Patched {path}: replaced {removed} line(s) with {added} line(s)")],
            metadata={"replacements": 1},
            files_modified=[workspace_path(context, approved or path)],
        )


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


async def _patch_any_newline(
    context: ToolContext, path: str, old: str, new: str, approved: str | None
) -> None:
    """Patch as given; when that finds nothing and ``old`` spans lines, try the other line ending.

    Models send ``\n``: in a CRLF file, ``old`` then matches with ``\r\n`` and ``new`` is
    written with ``\r\n`` too, so the file keeps one line ending. Each attempt is atomic and
    changes nothing when it does not match.

    Raises:
        FileOpError: no attempt matched exactly once (the first attempt's error), or another failure.
    """
    try:
        await context.workspace_files.patch(
            path, old, new, approved=approved, expect_sha256=context.reviewed_sha256
        )
        return
    except FileOpError as exc:
        if exc.code != "no_match" or "\n" not in old:
            raise
        first = exc
    crlf = "\r\n" in old
    other_old = _lf(old) if crlf else old.replace("\n", "\r\n")
    other_new = _lf(new) if crlf else _lf(new).replace("\n", "\r\n")
    try:
        await context.workspace_files.patch(
            path, other_old, other_new, approved=approved, expect_sha256=context.reviewed_sha256
        )
    except FileOpError as exc:
        raise (first if exc.code == "no_match" else exc) from None


async def _newline_note(context: ToolContext, path: str, old: str, approved: str | None) -> str:
    """Why the line endings may be the reason ``old`` did not match ('' when they are not)."""
    try:
        head = await context.workspace_files.read_bytes(path, max_bytes=1 << 20, approved=approved)
    except FileOpError:
        return ""
    file_crlf, file_lf = b"\r\n" in head, b"\n" in head.replace(b"\r\n", b"")
    if file_crlf and file_lf:
        return (
            "The file mixes CRLF (\\r\\n) and LF (\\n) line endings, so `old` must use the same "
            "ending as each line it spans. "
        )
    if "\r" in old and not file_crlf:
        return "`old` contains \\r but the file has no CRLF line endings. "
    return ""
