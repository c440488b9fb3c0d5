"""Fixtures: a local agent sandbox over a temp workspace and a ToolContext builder for it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.types import Tool, ToolContext, ToolOutput
from dispatcher.sandbox.local import LocalSandbox


@dataclass
class Harness:
    """One tool call's surroundings: sandbox, cancel event and the deltas it emitted."""

    sandbox: LocalSandbox
    workspace: Path
    cancel_event: asyncio.Event = field(default_factory=asyncio.Event)
    deltas: list[tuple[str, str]] = field(default_factory=list)

    def context(self) -> ToolContext:
        return ToolContext(
            session_id="s1",
            turn_id="t1",
            tool_use_id="tu1",
            workspace_path=str(self.workspace),
            cancel_event=self.cancel_event,
            logger=logging.LoggerAdapter(logging.getLogger("tests.tools"), {}),
            workspace_files=self.sandbox,
            sandbox=self.sandbox,
            emit_output=lambda stream, text: self.deltas.append((stream, text)),
        )

    async def run(self, tool: Tool, **input: Any) -> ToolOutput:
        return await tool.execute(input, self.context())

    @property
    def streamed(self) -> str:
        return "".join(text for _, text in self.deltas)


@pytest.fixture
async def harness(workspace: Path) -> AsyncIterator[Harness]:
    sandbox = LocalSandbox(str(workspace), kill_wait=30.0)  # bounds a wait: see tests/unit/sandbox
    yield Harness(sandbox, workspace)
    await sandbox.aclose()


def text_of(output: ToolOutput) -> str:
    """The text of a single-text-block output."""
    (block,) = output.content
    assert block.type == "text"
    return block.text
