"""What the built-in file tools share: cancellation before start, path schema, result paths."""

from __future__ import annotations

import posixpath
from typing import Any

from dispatcher.core.errors import ToolCancelled
from dispatcher.core.paths import resolve_workspace_path
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.text.visible import visible
from dispatcher.core.types import ToolContext

PATH_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "description": "Path relative to the workspace root, or absolute inside /workspace.",
}


STAGED_WRITE_NOTE = (
    "In a review or audit session the write is staged, not yet on disk: the result says "
    '"staged for review as ID", read_file and list_dir of this session show the staged content, '
    "shell sees the disk until a human applies the change."
)
"""What write tools say of review and audit modes (``core/call/review.py``) in their description."""


def start(context: ToolContext) -> None:
    """File operations are short: honour a cancel that came before they start, then finish."""
    if context.cancel_event.is_set():
        raise ToolCancelled("cancelled before it started")


def workspace_path(context: ToolContext, path: str) -> str:
    """The path reported in ``files_modified``: normalised, relative to the workspace root, the same
    form as ``projected_modifications`` in a confirmation request (``src/auth.ts``)."""
    root = context.workspace_files.workspace_root
    relative = posixpath.relpath(resolve_workspace_path(path, root), posixpath.normpath(root))
    return visible(relative, escape_backslash=True)


def explain(exc: FileOpError, path: str) -> FileOpError:
    """Add what the model should do next to the errors it can fix itself."""
    hints = {
        "EISDIR": f"{path} is a directory; use list_dir to see what it contains.",
        "ENOTDIR": f"{path}: a part of this path is not a directory.",
        "ENOENT": f"{path} does not exist; use list_dir to see what is there.",
    }
    hint = hints.get(exc.code)
    return FileOpError(exc.code, hint) if hint is not None else exc


class FileTool:
    """Base of the file tools: they finish once started, so cancel() has nothing to stop."""

    async def cancel(self) -> bool:
        """Nothing to abort; file operations complete in milliseconds."""
        return False
