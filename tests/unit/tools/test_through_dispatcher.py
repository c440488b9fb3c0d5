"""The built-in tools registered in the real dispatcher over the local backend: results as clients see them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.core import ConfirmationPolicy, Session, ToolDispatcher, ToolErrorClass, ToolUseBlock
from dispatcher.sandbox.local import LocalSandboxProvider
from dispatcher.tools import builtin_factories


@pytest.fixture
async def dispatcher() -> AsyncIterator[ToolDispatcher]:
    provider = LocalSandboxProvider()
    d = ToolDispatcher(provider, policy=ConfirmationPolicy.preset("autonomous"))
    for factory in builtin_factories():
        d.register(factory, builtin=True)
    d.seal()
    yield d
    await d.aclose()
    await provider.aclose()


async def test_write_patch_read_shell_round_trip(dispatcher: ToolDispatcher, workspace: Path) -> None:
    session = Session("s1", str(workspace))
    dispatcher.open_session(session)
    calls = [
        ("write_file", {"path": "src/a.py", "content": "x = 1\n"}),
        ("patch_file", {"path": "src/a.py", "old": "x = 1", "new": "x = 2"}),
        ("read_file", {"path": "src/a.py"}),
        ("shell", {"command": "cat src/a.py; exit 2"}),
        ("read_file", {"path": "../../etc/passwd"}),
    ]
    results = [
        await dispatcher.dispatch(ToolUseBlock(f"tu{i}", name, tool_input), session)
        for i, (name, tool_input) in enumerate(calls)
    ]
    write, patch, read, shell, escape = results
    assert not write.is_error and write.files_modified == ("src/a.py",)
    assert not patch.is_error and (workspace / "src/a.py").read_text() == "x = 2\n"
    assert read.content[0].type == "text" and read.content[0].text == "x = 2\n"
    assert shell.is_error and shell.error_class is ToolErrorClass.EXECUTION_ERROR
    assert shell.metadata["exit_code"] == 2 and shell.command_executed == "cat src/a.py; exit 2"
    assert any(block.type == "text" and "x = 2" in block.text for block in shell.content)
    assert escape.is_error and escape.error_class is ToolErrorClass.PERMISSION_DENIED
