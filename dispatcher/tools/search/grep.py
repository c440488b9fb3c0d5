"""``grep {pattern, path?, glob?, ignore_case?, context_lines?, max_results?}``: lines matching a
regular expression in the workspace's files, as ``path:line:text``."""

from __future__ import annotations

from typing import Any

from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.text.visible import visible
from dispatcher.core.types import SideEffect, TextBlock, ToolContext, ToolDefinition, ToolOutput
from dispatcher.tools._common import PATH_SCHEMA, explain
from dispatcher.tools.search.run import DISPATCHER_SLACK, MAX_LINE, TIME_LIMIT, SearchTool, where

DEFAULT_RESULTS = 100
MAX_RESULTS = 1000
MAX_CONTEXT = 10
MAX_CHARS = 40_000
"""Characters of the result; under the dispatcher's 48,000-character budget, so it is not cut twice."""


class GrepTool(SearchTool):
    """Searches file contents with a regular expression, in the sandbox."""

    definition = ToolDefinition(
        name="grep",
        description=(
            "Search the contents of the workspace's files for a regular expression and return the "
            "matching lines as path:line:text (paths relative to the workspace root, ready for "
            "read_file), in path order. Searches path (a directory, recursively, or one file; "
            "default: the workspace root); glob keeps only files whose name matches (e.g. '*.py', "
            "'*.{ts,tsx}'; with a '/', the path under `path` must match, e.g. 'src/**/*.go'). "
            "Files and directories that .gitignore names, the .git directory, binary files and "
            "symlinks are skipped; hidden files are searched. context_lines shows lines around each "
            "match as path-line-text, with '--' between groups. At most max_results matches "
            f"(default {DEFAULT_RESULTS}, at most {MAX_RESULTS}), lines cut at {MAX_LINE} characters, "
            f"{TIME_LIMIT:g} s of searching; the result says when it stopped early. The pattern is "
            "a regular expression in the common syntax (. * + ? [] () | ^ $ \\b \\d \\s \\w {n,m}); "
            "escape literal parentheses and dots. Read-only: runs without asking. It searches the "
            "disk: in a review or audit session, writes staged by write_file or patch_file are not "
            "there until a human applies them (read_file shows them)."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 1000,
                    "description": "The regular expression to look for, matched within each line.",
                },
                "path": {**PATH_SCHEMA, "description": "File or directory to search; default '.'."},
                "glob": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 500,
                    "description": "Only search files matching this glob (e.g. '*.py').",
                },
                "ignore_case": {"type": "boolean", "description": "Match letters in either case."},
                "context_lines": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_CONTEXT,
                    "description": "Lines to show before and after each match (default 0).",
                },
                "max_results": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_RESULTS,
                    "description": f"Stop after this many matching lines (default {DEFAULT_RESULTS}).",
                },
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.READ,
        requires_fs=(("path", "r"),),
        kill_slack_seconds=DISPATCHER_SLACK,
    )

    async def execute(self, input: dict[str, Any], context: ToolContext) -> ToolOutput:
        """Return the matching lines, or a clear error (bad regex, missing path)."""
        path: str = input.get("path", ".")
        try:
            start = await where(context, path)
            answer = await self.run(
                context,
                {
                    "op": "grep",
                    "path": start,
                    "pattern": input["pattern"],
                    "glob": input.get("glob"),
                    "ignore_case": bool(input.get("ignore_case", False)),
                    "context_lines": int(input.get("context_lines", 0)),
                    "max_results": int(input.get("max_results", DEFAULT_RESULTS)),
                },
            )
        except FileOpError as exc:
            raise explain(exc, path) from exc
        return format_answer(answer, int(input.get("max_results", DEFAULT_RESULTS)))


def format_line(line: Any) -> str:
    """``path:line:text`` for a match, ``path-line-text`` for context, ``--`` between groups."""
    if line is None:
        return "--"
    path, number, is_match, text = line
    sep = ":" if is_match else "-"
    return f"{visible(str(path), escape_backslash=True)}{sep}{int(number)}{sep}{text}"


def format_answer(answer: dict[str, Any], max_results: int) -> ToolOutput:
    """The program's answer as the model reads it, with notes on every bound that cut it."""
    shown: list[str] = []
    used = 0
    cut = False
    lines = answer.get("lines", [])
    for line in lines:
        text = format_line(line)
        if used + len(text) + 1 > MAX_CHARS:
            cut = True
            break
        shown.append(text)
        used += len(text) + 1
    notes = []
    if answer.get("more"):
        notes.append(f"stopped at max_results={max_results} matches; narrow the pattern, path or glob")
    cut = cut or bool(answer.get("cut"))
    if cut:
        notes.append(
            f"output cut at about {MAX_CHARS:,} characters ({len(shown)} lines shown); "
            "lower max_results or context_lines, or narrow the search"
        )
    if answer.get("timed_out"):
        seconds = float(answer.get("time_limit", TIME_LIMIT))
        notes.append(f"stopped after {seconds:g} s of searching: results are partial; narrow path or glob")
    body = "\n".join(shown) if shown else "No matches."
    if notes:
        body += "\n[" + "; ".join(notes) + "]"
    return ToolOutput(
        content=[TextBlock(body)],
        metadata={
            "matches": int(answer.get("matches", 0)),
            "files": int(answer.get("files", 0)),
            "truncated": bool(answer.get("more")) or cut,
            "timed_out": bool(answer.get("timed_out")),
            "engine": str(answer.get("engine", "")),
        },
    )
