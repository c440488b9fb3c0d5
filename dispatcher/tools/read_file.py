"""``read_file {path, offset?, limit?}``: text by lines, images as image blocks, binary refused."""

from __future__ import annotations

from typing import Any

from dispatcher.core.errors import ToolExecutionError
from dispatcher.core.sandbox_api import FileOpError, WorkspaceFileAPI
from dispatcher.core.types import ImageBlock, SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import PATH_SCHEMA, FileTool, explain, start

READ_CAP = 256 * 1024  # bytes of a text file read_file can look at
IMAGE_CAP = 5 * 1024 * 1024  # what model providers accept for one image
CONTENT_CAP = 12_000  # characters returned per call; the rest is paged with offset/limit
SNIFF = 8192  # bytes inspected for NUL to call a file binary


def image_type(data: bytes) -> str | None:
    """The media type of a PNG, JPEG, GIF or WebP image, from its magic bytes."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


class ReadFileTool(FileTool):
    """Reads a workspace file."""

    definition = ToolDefinition(
        name="read_file",
        description=(
            "Read a file from the workspace. Text comes back as is; use offset (1-based line) and "
            f"limit (lines) to page through long files (at most {CONTENT_CAP:,} characters per call). "
            "PNG, JPEG, GIF and WebP files come back as images; other binary files are refused "
            "(inspect them with shell: file, od, base64). In a review or audit session a file with a staged "
            "change reads as staged (not yet on disk; shell sees the disk)."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": PATH_SCHEMA,
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Maximum number of lines to return.",
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.READ,
        requires_fs=(("path", "r"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Return the selected lines, an image block, or a clear error."""
        start(context)
        path: str = input["path"]
        files = context.workspace_files
        approved = context.resolved.get("path")  # where it really was when confirmed: used exactly
        try:
            data = await files.read_bytes(path, max_bytes=READ_CAP + 1, approved=approved)
            media_type = image_type(data)
            if media_type is not None and len(data) > READ_CAP:
                data = await files.read_bytes(path, max_bytes=IMAGE_CAP + 1, approved=approved)
        except FileOpError as exc:
            raise explain(exc, path) from exc
        if media_type is not None:
            if len(data) > IMAGE_CAP:
                raise FileOpError("too_large", f"{path} is an image larger than {IMAGE_CAP // 2**20} MiB")
            return ToolOutput(
                content=[ImageBlock(data=data, media_type=media_type)],
                metadata={"media_type": media_type, "bytes": len(data)},
            )
        if b"\x00" in data[:SNIFF]:
            size = await _size(files, path, data, approved)
            raise FileOpError(
                "binary",
                f"{path} is a binary file ({size:,} bytes); read_file shows text files and "
                "PNG/JPEG/GIF/WebP images only. To see what it is: shell `file PATH` or `od -c PATH | "
                "head`; its bytes as text: shell `base64 PATH` (small files). A client fetches files "
                "whole with DownloadFiles (CLI: dispatcher download SESSION PATH DIR).",
            )
        size = await _size(files, path, data, approved)
        return _text_output(path, data, size, input.get("offset", 1), input.get("limit"))


async def _size(files: WorkspaceFileAPI, path: str, data: bytes, approved: str | None) -> int:
    """The file's size: known when all of it was read, else asked (one more round trip)."""
    if len(data) <= READ_CAP:
        return len(data)
    try:
        return (await files.stat(path, approved=approved)).size
    except FileOpError as exc:
        raise explain(exc, path) from exc


def _text_output(path: str, data: bytes, size: int, offset: int, limit: int | None) -> ToolOutput:
    partial = len(data) > READ_CAP
    if partial:
        data = data[:READ_CAP]
        cut = data.rfind(b"\n")
        data = data[: cut + 1] if cut >= 0 else data  # whole lines only
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the text ended with a newline (or was empty)
    total = len(lines)
    if total == 0:
        if offset > 1:
            raise ToolExecutionError(f"offset {offset} is past the end of {path}, which is empty")
        return ToolOutput(content=[TextBlock("[empty file]")], metadata={"lines": 0})
    if offset > total:
        if partial:
            raise ToolExecutionError(
                f"offset {offset} is past what read_file can reach of {path}: its first "
                f"{READ_CAP // 1024} KiB hold {total} lines of its {size:,} bytes; use shell "
                f"(e.g. sed -n '{offset},+199p' {path}) to read further, wc -l {path} to count lines"
            )
        raise ToolExecutionError(f"offset {offset} is past the end of {path}, which has {total} lines")
    first = offset - 1
    stop = total if limit is None else min(total, first + limit)
    shown: list[str] = []
    used = 0
    for line in lines[first:stop]:
        if used + len(line) + 1 > CONTENT_CAP:
            if not shown:  # a single enormous line: show its start rather than nothing
                shown.append(line[:CONTENT_CAP] + " [... line cut ...]")
            break
        shown.append(line)
        used += len(line) + 1
    last = first + len(shown)  # 1-based number of the last line shown
    body = "\n".join(shown)
    if last < total or partial or text.endswith("\n"):
        body += "\n"  # keep the file's own final newline; before a note, end the last line
    notes = []
    # Of a partly read file the line count is only known for the part read: say so, never pass
    # the part's count off as the file's.
    of = f"the first {total} (of about {total * size // max(len(data), 1):,})" if partial else f"{total}"
    if last < total:
        notes.append(f"showing lines {offset}-{last} of {of}; use offset={last + 1} to continue")
    if partial:
        notes.append(
            f"the file is {size:,} bytes, larger than {READ_CAP // 1024} KiB; only its first {total} "
            f"lines can be read here, use shell for the rest (wc -l {path} counts them all)"
        )
    if notes:
        body += "[" + "; ".join(notes) + "]"
    metadata: dict[str, object] = {
        "lines": None if partial else total,
        "lines_read": total,
        "bytes": size,
        "start_line": offset,
        "end_line": last,
        "truncated": bool(notes),
    }
    return ToolOutput(content=[TextBlock(body)], metadata=metadata)
