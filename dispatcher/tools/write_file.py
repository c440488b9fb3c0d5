"""``write_file {path, content}``: create or replace a file atomically."""

from __future__ import annotations

from typing import Any

from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import PATH_SCHEMA, FileTool, explain, start, workspace_path


class WriteFileTool(FileTool):
    """Creates or overwrites a workspace file."""

    definition = ToolDefinition(
        name="write_file",
        description=(
            "Create a file or overwrite it entirely with the given content (UTF-8). Missing parent "
            "directories are created; an existing file keeps its permissions. The write is atomic. "
            "To change part of a file, prefer patch_file."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "path": PATH_SCHEMA,
                "content": {"type": "string", "description": "The complete new content of the file."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.WRITE,
        requires_fs=(("path", "rw"),),
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Write the content and report its size."""
        start(context)
        path: str = input["path"]
        content: str = input["content"]
        try:
            await context.workspace_files.write(path, content)
        except FileOpError as exc:
            raise explain(exc, path) from exc
        size = len(content.encode("utf-8", errors="surrogatepass"))
        lines = content.count("\n") + (0 if content.endswith("\n") or not content else 1)
        return ToolOutput(
            content=[TextBlock(f"Wrote {lines} line{'' if lines == 1 else 's'} ({size:,} bytes) to {path}")],
            metadata={"bytes": size, "lines": lines},
            files_modified=[workspace_path(context, path)],
        )
