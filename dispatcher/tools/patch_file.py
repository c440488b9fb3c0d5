"""``patch_file {path, old, new}``: replace text that occurs exactly once, atomically.

``patched`` is the one definition of what a patch does: the tool writes what it computes, and
review and audit modes stage the same (``preview``)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

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
            "enough surrounding lines to make it unique. The file is unchanged if it does not match. "
            "In a file with CRLF line endings, write `old` and `new` with plain newlines: they "
            "match the CRLF lines and the replacement is written with CRLF. " + STAGED_WRITE_NOTE
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
        """Apply the replacement or explain why it could not be applied.

        The file is read, changed here by ``preview`` (the one definition of what a patch does,
        staging's too) and written back whole, atomically and only over the bytes it was read
        as: a change made meanwhile is refused by the sandbox just before its rename, never lost.
        """
        start(context)
        path: str = input["path"]
        approved = context.resolved.get("path")  # where it really was when confirmed: used exactly
        files = context.workspace_files
        try:
            current = await files.read_bytes(path, approved=approved)
        except FileOpError as exc:
            raise explain(exc, path) from exc
        read_as = hashlib.sha256(current).hexdigest()
        after = self.preview(input, current)
        try:
            await files.write_bytes(path, after, approved=approved, expect_sha256=read_as)
        except FileOpError as exc:
            if exc.code == "changed":
                raise FileOpError(
                    "changed",
                    f"{path} changed while it was being patched (written meanwhile, or replaced by a "
                    "link); nothing was written. Read the file again and repeat the call.",
                ) from exc
            raise explain(exc, path) from exc
        removed, added = input["old"].count("\n") + 1, input["new"].count("\n") + 1
        return ToolOutput(
            content=[TextBlock(f"Patched {path}: replaced {removed} line(s) with {added} line(s)")],
            metadata={"replacements": 1},
            files_modified=[workspace_path(context, approved or path)],
        )

    def preview(self, input: Mapping[str, Any], current: bytes | None) -> bytes:
        """The file after the replacement (see ``patched``).

        Raises:
            FileOpError: no file (``ENOENT``), or ``old`` does not occur exactly once.
        """
        path = str(input["path"])
        if current is None:
            raise explain(FileOpError("ENOENT", f"{path}: no such file"), path)
        return patched(current, str(input["old"]), str(input["new"]), path)


def patched(data: bytes, old: str, new: str, path: str) -> bytes:
    """``data`` with the one occurrence of ``old`` replaced by ``new``.

    As given first; when that finds nothing and ``old`` spans lines, with the other line ending.
    Models send ``\n``: in a CRLF file, ``old`` then matches with ``\r\n`` and ``new`` is put in
    with ``\r\n`` too, so the file keeps one line ending (and the other way round). Matching is
    on the UTF-8 bytes: UTF-8 is self-synchronising, so a byte match is a character match.

    Raises:
        FileOpError: ``no_match`` (no attempt matched), ``multiple_matches`` (an attempt matched
            more than once), ``decode`` (the text cannot be UTF-8).
    """
    attempts = [(old, new)]
    if "\n" in old:
        crlf = "\r\n" in old
        attempts.append((_lf(old), _lf(new)) if crlf else (old.replace("\n", "\r\n"), _crlf(new)))
    for old_text, new_text in attempts:
        needle = _encode(old_text, path)
        count = data.count(needle) if needle else 0
        if count == 1:
            return data.replace(needle, _encode(new_text, path), 1)
        if count > 1:
            raise FileOpError(
                "multiple_matches",
                f"{path}: the text to replace occurs {count} times. `old` must occur exactly once; "
                "include more surrounding lines to make it unique. The file was not changed.",
            )
    raise FileOpError(
        "no_match",
        f"`old` was not found in {path}. It must match the file exactly, including whitespace and "
        f"indentation; read the file again and copy the text. {_newline_note(data, old)}The file "
        "was not changed.",
    )


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


def _crlf(text: str) -> str:
    return _lf(text).replace("\n", "\r\n")


def _encode(text: str, path: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise FileOpError("decode", f"{path}: text cannot be encoded as UTF-8") from None


def _newline_note(data: bytes, old: str) -> str:
    """Why the line endings may be the reason ``old`` did not match ('' when they are not)."""
    file_crlf, file_lf = b"\r\n" in data, b"\n" in data.replace(b"\r\n", b"")
    if file_crlf and file_lf:
        return (
            "The file mixes CRLF (\\r\\n) and LF (\\n) line endings, so `old` must use the same "
            "ending as each line it spans. "
        )
    if "\r" in old and not file_crlf:
        return "`old` contains \\r but the file has no CRLF line endings. "
    return ""
