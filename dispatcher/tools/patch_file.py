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
            "enough surrounding lines to make it unique. The file is unchanged if it does not match."
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
        try:
            await context.workspace_files.patch(path, old, new)
        except FileOpError as exc:
            if exc.code == "no_match":
                raise FileOpError(
                    "no_match",
                    f"`old` was not found in {path}. It must match the file exactly, including "
                    "whitespace and indentation; read the file again and copy the text. "
                    "The file was not changed.",
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
            files_modified=[workspace_path(context, path)],
        )
