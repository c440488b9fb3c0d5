"""``patch_file {path, old, new, replace_all?}``: replace text that occurs exactly once (or every
occurrence), atomically.

``core/patch.py`` is the one definition of what a patch does: the tool applies it (``apply_patch``,
what ``WorkspaceFileAPI.patch`` does for custom tools too), and review and audit modes stage what it
computes (``preview``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.core.patch import apply_patch, patched
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import (
    PATH_SCHEMA,
    STAGED_WRITE_NOTE,
    FileTool,
    explain,
    start,
    workspace_path,
)


class PatchFileTool(FileTool):
    """Edits a workspace file str_replace-style; ``Previewable`` (review and audit modes stage its change)."""

    definition = ToolDefinition(
        name="patch_file",
        description=(
            "Replace one exact piece of text in a file. `old` must occur exactly once in the file, "
            "matching it character for character (whitespace and indentation included); include "
            "enough surrounding lines to make it unique, or set replace_all to replace every "
            "occurrence (a rename; the result says how many). The file is unchanged if it does not "
            "match. "
            "In a file with CRLF line endings, write `old` and `new` with plain newlines: they "
            "match the CRLF lines and the replacement is written with CRLF. " + STAGED_WRITE_NOTE
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": PATH_SCHEMA,
                "old": {"type": "string", "minLength": 1, "description": "The exact text to replace."},
                "new": {"type": "string", "description": "The text to put in its place."},
                "replace_all": {
                    "type": "boolean",
                    "description": "Replace every occurrence of `old` instead of requiring exactly one "
                    "(default false).",
                },
            },
            "required": ["path", "old", "new"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.WRITE,
        requires_fs=(("path", "rw"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Apply the replacement or explain why it could not be applied.

        The file is read, changed by ``patched`` (the one definition of what a patch does,
        staging's too) and written back whole, atomically and only over the bytes it was read
        as: a change made meanwhile is refused by the sandbox just before its rename, never lost
        (``apply_patch``).
        """
        start(context)
        path: str = input["path"]
        approved = context.resolved.get("path")  # where it really was when confirmed: used exactly
        replace_all = bool(input.get("replace_all", False))
        try:
            count = await apply_patch(
                context.workspace_files,
                path,
                input["old"],
                input["new"],
                approved=approved,
                replace_all=replace_all,
            )
        except FileOpError as exc:
            raise explain(exc, path) from exc
        removed, added = input["old"].count("\n") + 1, input["new"].count("\n") + 1
        what = f"replaced {removed} line(s) with {added} line(s)"
        if replace_all:
            what = f"replaced {count} occurrence(s), each of {removed} line(s) with {added} line(s)"
        return ToolOutput(
            content=[TextBlock(f"Patched {path}: {what}")],
            metadata={"replacements": count},
            files_modified=[workspace_path(context, approved or path)],
        )

    def preview(self, input: Mapping[str, Any], current: bytes | None) -> bytes:
        """The file after the replacement (see ``patched``).

        Raises:
            FileOpError: no file (``ENOENT``), or ``old`` does not occur exactly once (without
                ``replace_all``) or at all.
        """
        path = str(input["path"])
        if current is None:
            raise explain(FileOpError("ENOENT", f"{path}: no such file"), path)
        return patched(
            current, str(input["old"]), str(input["new"]), path, replace_all=bool(input.get("replace_all"))
        )
