"""``list_dir {path?}``: one directory level, bounded, with type markers."""

from __future__ import annotations

from typing import Any

from dispatcher.core.sandbox_api import DirEntry, FileOpError
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import PATH_SCHEMA, FileTool, explain, start

MAX_ENTRIES = 500


def format_entry(entry: DirEntry) -> str:
    """``name/`` for directories, ``name@ -> target`` for symlinks, ``name`` otherwise."""
    if entry.kind == "dir":
        return entry.name + "/"
    if entry.kind == "symlink":
        return f"{entry.name}@ -> {entry.target or '?'}"
    return entry.name


class ListDirTool(FileTool):
    """Lists a workspace directory."""

    definition = ToolDefinition(
        name="list_dir",
        description=(
            "List the entries of a workspace directory (default: the workspace root), sorted by name. "
            f"Directories end with '/', symlinks show '@ -> target'. At most {MAX_ENTRIES} entries."
        ),
        input_schema={
            "type": "object",
            "properties": {"path": {**PATH_SCHEMA, "description": "Directory to list; default '.'."}},
            "additionalProperties": False,
        },
        side_effect=SideEffect.READ,
        requires_fs=(("path", "r"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Return one entry per line, and a marker when the listing was cut."""
        start(context)
        path: str = input.get("path", ".")
        try:
            listing = await context.workspace_files.list(path, limit=MAX_ENTRIES)
        except FileOpError as exc:
            raise explain(exc, path) from exc
        lines = [format_entry(entry) for entry in listing.entries]
        if listing.truncated:
            lines.append(
                f"[... truncated: more than {len(listing.entries)} entries; list a subdirectory ...]"
            )
        text = "\n".join(lines) if lines else "[empty directory]"
        return ToolOutput(
            content=[TextBlock(text)],
            metadata={"entries": len(listing.entries), "truncated": listing.truncated},
        )
