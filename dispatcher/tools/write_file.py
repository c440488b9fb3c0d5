"""``write_file {path, content, encoding?}``: create or replace a file atomically, text or base64."""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.core.errors import ToolValidationError
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

DEFAULT_MAX_WRITE_BYTES = (4 << 20) - (64 << 10)
"""Bytes one write_file may write (``dispatcher.max_write_bytes``): a default gRPC message less room."""
_BASE64_SPACE = b" \t\r\n"


def decode_base64(text: str) -> bytes:
    """Strict base64 (RFC 4648 alphabet, padded, canonical); ASCII whitespace between is ignored.

    Raises:
        ValueError: anything else, so that bad input never becomes a silently different file.
    """
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError("base64 content holds a non-ASCII character") from None
    raw = raw.translate(None, _BASE64_SPACE)
    try:
        data = base64.b64decode(raw, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"content is not valid base64 ({exc})") from None
    if base64.b64encode(data) != raw:  # non-zero padding bits: another encoder's bytes, refused
        raise ValueError("content is not canonical base64 (its last character has stray bits)")
    return data


def _size(input_: Mapping[str, Any]) -> int | None:
    """Bytes the content will write, without decoding it; None when it is not a string."""
    content = input_.get("content")
    if not isinstance(content, str):
        return None
    if input_.get("encoding") == "base64":
        length = len(content) - sum(content.count(c) for c in " \t\r\n")
        return length * 3 // 4 - content.rstrip(" \t\r\n")[-2:].count("=")
    return len(content.encode("utf-8", errors="surrogatepass"))


@dataclass(frozen=True, slots=True)
class InputCheck:
    """The size limit, and base64 that decodes: both refused at validation, before anyone is asked.

    A value object rather than a bound method, so that two instances' definitions compare equal.
    """

    max_bytes: int

    def __call__(self, input_: Mapping[str, Any]) -> list[str]:
        size = _size(input_)
        if size is None:
            return []
        if size > self.max_bytes:
            return [
                f"$.content: {size:,} bytes, more than write_file's limit of {self.max_bytes:,} bytes "
                "(dispatcher.max_write_bytes); send large files with UploadFiles"
            ]
        if input_.get("encoding") == "base64":
            try:
                decode_base64(input_["content"])
            except ValueError as exc:
                return [f"$.content: {exc}"]
        return []


@functools.cache
def definition(max_bytes: int) -> ToolDefinition:
    """write_file's definition for a size limit (one object per limit, made once)."""
    return ToolDefinition(
        name="write_file",
        description=(
            "Create a file or overwrite it entirely with the given content. Missing parent "
            "directories are created; an existing file keeps its permissions. The write is atomic. "
            'content is UTF-8 text, or with "encoding": "base64" the file\'s bytes in base64 '
            "(for binary files such as images or archives). At most "
            f"{max_bytes:,} bytes per file (after decoding); larger files reach the workspace "
            "through the client's UploadFiles. To change part of a text file, prefer patch_file. "
            + STAGED_WRITE_NOTE
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": PATH_SCHEMA,
                "content": {"type": "string", "description": "The complete new content of the file."},
                "encoding": {
                    "type": "string",
                    "enum": ["utf-8", "base64"],
                    "description": 'How content is encoded: "utf-8" text (default) or "base64" bytes.',
                },
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.WRITE,
        requires_fs=(("path", "rw"),),
        check_input=InputCheck(max_bytes),
    )


class WriteFileTool(FileTool):
    """Creates or overwrites a workspace file; ``Previewable`` (review and audit modes stage its change)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_WRITE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.definition = definition(max_bytes)

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Write the content and report its size."""
        start(context)
        path: str = input["path"]
        content: str = input["content"]
        binary = input.get("encoding") == "base64"
        approved = context.resolved.get("path")  # where it really was when confirmed: used exactly
        size = _size(input)
        if size is not None and size > self.max_bytes:  # called without the dispatcher's check
            raise ToolValidationError(f"content is {size:,} bytes, more than {self.max_bytes:,}")
        data = self.preview(input, None)
        try:
            await context.workspace_files.write_bytes(path, data, approved=approved)
        except FileOpError as exc:
            raise explain(exc, path) from exc
        size = len(data)
        if binary:
            what = f"{size:,} bytes"
            metadata: dict[str, Any] = {"bytes": size}
        else:
            lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
            what = f"{lines} line{'' if lines == 1 else 's'} ({size:,} bytes)"
            metadata = {"bytes": size, "lines": lines}
        return ToolOutput(
            content=[TextBlock(f"Wrote {what} to {path}")],
            metadata=metadata,
            files_modified=[workspace_path(context, approved or path)],
        )

    def preview(self, input: Mapping[str, Any], current: bytes | None) -> bytes:
        """The bytes written: the content whatever the file was.

        Raises:
            ToolValidationError: base64 content that does not decode.
            FileOpError: text that cannot be UTF-8 (``decode``).
        """
        content = str(input["content"])
        if input.get("encoding") == "base64":
            try:
                return decode_base64(content)
            except ValueError as exc:
                raise ToolValidationError(str(exc)) from None
        try:
            return content.encode("utf-8")
        except UnicodeEncodeError:
            raise FileOpError("decode", f"{input['path']}: text cannot be encoded as UTF-8") from None
