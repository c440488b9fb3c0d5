"""The built-in tools (design §4; the process tools of issue 32), written against the core
sandbox API only."""

from __future__ import annotations

import functools

from dispatcher.core.types import ToolFactory
from dispatcher.tools.code import RunCodeTool
from dispatcher.tools.code.contexts import DEFAULT_IDLE_SECONDS, DEFAULT_MAX_CONTEXTS
from dispatcher.tools.list_dir import ListDirTool
from dispatcher.tools.patch_file import PatchFileTool
from dispatcher.tools.processes import (
    ProcessInputTool,
    ProcessListTool,
    ProcessOutputTool,
    ProcessStopTool,
)
from dispatcher.tools.read_file import ReadFileTool
from dispatcher.tools.search import GlobTool, GrepTool
from dispatcher.tools.shell import ShellTool
from dispatcher.tools.write_file import DEFAULT_MAX_WRITE_BYTES, WriteFileTool

BUILTIN_TOOLS: list[ToolFactory] = [
    ReadFileTool,
    WriteFileTool,
    PatchFileTool,
    ListDirTool,
    GlobTool,
    GrepTool,
    ShellTool,
    RunCodeTool,
    ProcessListTool,
    ProcessOutputTool,
    ProcessInputTool,
    ProcessStopTool,
]
"""Each class is a zero-argument factory producing a fresh tool per call."""


def builtin_factories(
    *,
    max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
    shell_persist: bool = True,
    code_contexts: int = DEFAULT_MAX_CONTEXTS,
    code_idle_seconds: float = DEFAULT_IDLE_SECONDS,
) -> list[ToolFactory]:
    """A fresh list of the built-in tool factories, for registration, with the configured limits
    (``shell_persist``: ``tools.shell.persist``; ``code_*``: ``tools.run_code``)."""
    factories = list(BUILTIN_TOOLS)
    if max_write_bytes != DEFAULT_MAX_WRITE_BYTES:
        factories[factories.index(WriteFileTool)] = functools.partial(WriteFileTool, max_write_bytes)
    if not shell_persist:
        factories[factories.index(ShellTool)] = functools.partial(ShellTool, persist=False)
    if (code_contexts, code_idle_seconds) != (DEFAULT_MAX_CONTEXTS, DEFAULT_IDLE_SECONDS):
        factories[factories.index(RunCodeTool)] = functools.partial(
            RunCodeTool, max_contexts=code_contexts, idle_seconds=code_idle_seconds
        )
    return factories


__all__ = [
    "BUILTIN_TOOLS",
    "GlobTool",
    "GrepTool",
    "ListDirTool",
    "PatchFileTool",
    "ProcessInputTool",
    "ProcessListTool",
    "ProcessOutputTool",
    "ProcessStopTool",
    "ReadFileTool",
    "RunCodeTool",
    "ShellTool",
    "WriteFileTool",
    "builtin_factories",
]
