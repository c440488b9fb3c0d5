"""``list_dir {path?}``: one directory level, bounded, with type markers."""

from __future__ import annotations

from typing import Any

from dispatcher.core.sandbox_api import DirEntry, FileOpError
from dispatcher.core.text.visible import visible
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import PATH_SCHEMA, FileTool, explain, start

MAX_ENTRIES = 500


def format_entry(entry: DirEntry) -> str:
    """``name/`` for directories, ``name@ -> target`` for symlinks, ``name`` otherwise.

    The sandbox chooses names and link targets, so both are escaped (``visible`` with backslashes
    doubled): one entry is always one line, a newline in a name cannot forge a second entry, and
    bidi or control characters (or bytes that are not UTF-8) show as escapes, not as what they do.
    """
    name = visible(entry.name, escape_backslash=True)
    if entry.kind == "dir":
        return name + "/"
    if entry.kind == "symlink":
        target = visible(entry.target, escape_backslash=True) if entry.target else "?"
        return f"{name}@ -> {target}"
    return name


class ListDirTool(FileTool):
    """Lists a workspace directory."""

    definition = ToolDefinition(
        name="list_dir",
        description=(
            "List the entries of a workspace directory (default: the workspace root), sorted by name. "
            f"Directories end with '/', symlinks show '@ -> target'. At most {MAX_ENTRIES} entries. "
            "Names are escaped: a backslash shows as '\\\\', a newline as '\\n', other control and "
            "bidi characters (and bytes that are not UTF-8) as \\xNN / \\uNNNN escapes. Give a "
            "name back to any file tool exactly as listed, escapes included: it reaches that file. "
            "In a review or audit session, files with staged changes (not yet on disk) are listed "
            "and named in a note at the end; shell sees the disk."
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
            listing = await context.workspace_files.list(
                path, limit=MAX_ENTRIES, approved=context.resolved.get("path")
            )
        except FileOpError as exc:
            raise explain(exc, path) from exc
        lines = [format_entry(entry) for entry in listing.entries]
        if listing.truncated:
            lines.append(
                f"[... truncated: more than {len(listing.entries)} entries; list a subdirectory ...]"
            )
        staged = [
            f"{format_entry(e)} ({e.size:,} bytes)" if e.kind == "file" else format_entry(e)
            for e in listing.entries
            if e.staged
        ]
        if staged:
            lines.append("[staged, not yet on disk: " + ", ".join(staged) + "]")
        text = "\n".join(lines) if lines else "[empty directory]"
        return ToolOutput(
            content=[TextBlock(text)],
            metadata={
                "entries": len(listing.entries),
                "truncated": listing.truncated,
                **({"staged": len(staged)} if staged else {}),
            },
        )
