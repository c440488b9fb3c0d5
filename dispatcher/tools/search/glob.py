"""``glob {pattern, path?}``: the workspace's files whose path matches a glob, newest first."""

from __future__ import annotations

from typing import Any

from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.text.visible import visible
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import PATH_SCHEMA, explain
from dispatcher.tools.search.run import DISPATCHER_SLACK, TIME_LIMIT, SearchTool, where

MAX_PATHS = 200
"""Paths returned; the total is counted and reported."""


class GlobTool(SearchTool):
    """Finds files by path pattern, in the sandbox."""

    definition = ToolDefinition(
        name="glob",
        description=(
            "Find files by path pattern, e.g. '**/*.py', 'src/**/*.{ts,tsx}', 'docs/*.md'. The "
            "pattern is matched against each file's path under `path` (default: the workspace root): "
            "'*' and '?' stay within one directory, '**/' spans any number of them (none "
            "included), '{a,b}' gives alternatives, '[...]' a character class; so '*.py' matches "
            "only at the top of `path`, '**/*.py' at any depth. Returns file paths relative to the "
            f"workspace root (ready for read_file), newest first, at most {MAX_PATHS} (the result "
            "says how many matched). Files and directories that .gitignore names, the .git "
            "directory and symlinks are skipped; hidden files are included; directories are not "
            f"listed. Stops after {TIME_LIMIT:g} s and says so. Read-only: runs without asking. It "
            "sees the disk: in a review or audit session, files staged by write_file are not there."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1000,
                    "description": "The glob pattern, relative to path.",
                },
                "path": {**PATH_SCHEMA, "description": "Directory to search in; default '.'."},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.READ,
        requires_fs=(("path", "r"),),
        kill_slack_seconds=DISPATCHER_SLACK,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Return the matching paths, newest first, or a clear error."""
        path: str = input.get("path", ".")
        pattern: str = input["pattern"]
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise FileOpError(
                "bad_glob",
                f"the glob {pattern!r} must be relative to path (no leading '/', no '..'); "
                "give the directory to search in path",
            )
        try:
            start = await where(context, path)
            answer = await self.run(
                context, {"op": "glob", "path": start, "pattern": pattern, "max_results": MAX_PATHS}
            )
        except FileOpError as exc:
            raise explain(exc, path) from exc
        paths = [visible(str(p), escape_backslash=True) for p in answer.get("paths", [])]
        total = int(answer.get("total", len(paths)))
        notes = []
        if total > len(paths):
            notes.append(f"showing the {len(paths)} newest of {total:,} matching files; narrow the pattern")
        if answer.get("timed_out"):
            seconds = float(answer.get("time_limit", TIME_LIMIT))
            notes.append(f"stopped after {seconds:g} s of walking: results are partial; narrow path")
        body = "\n".join(paths) if paths else f"No files match {pattern!r}."
        if notes:
            body += "\n[" + "; ".join(notes) + "]"
        return ToolOutput(
            content=[TextBlock(body)],
            metadata={
                "files": len(paths),
                "total": total,
                "truncated": total > len(paths),
                "timed_out": bool(answer.get("timed_out")),
                "engine": str(answer.get("engine", "")),
            },
        )
