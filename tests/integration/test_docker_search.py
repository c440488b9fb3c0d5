"""glob and grep in a real Docker sandbox: they find what grep -rn and find find, on a real tree."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.sandbox_api import ExecRequest, Sandbox
from dispatcher.core.sessions.session import Session
from dispatcher.core.types import TextBlock, Tool, ToolOutput
from dispatcher.tools import GlobTool, GrepTool
from dispatcher.tools.search import run
from tests.integration.helpers import tool_context

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]


async def call(tool: Tool, sandbox: Sandbox, session: Session, **input: Any) -> ToolOutput:
    context, _ = tool_context(sandbox, session.workspace_path)
    return await tool.execute(input, context)


def text(output: ToolOutput) -> str:
    return "".join(block.text for block in output.content if isinstance(block, TextBlock))


async def shell(sandbox: Sandbox, command: str) -> tuple[int | None, str]:
    out = bytearray()
    result = await sandbox.exec(
        ExecRequest(command=command, timeout=60), lambda _, data: out.extend(data), asyncio.Event()
    )
    return result.exit_code, out.decode()


def copy_real_tree(session: Session) -> Path:
    """This repository's ``dispatcher/core`` package (no caches): a real source tree."""
    target = Path(session.workspace_path) / "src"
    shutil.copytree(REPO / "dispatcher" / "core", target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


async def test_grep_finds_what_grep_rn_finds(sandbox: Sandbox, session: Session) -> None:
    copy_real_tree(session)
    pattern = r"^class [A-Za-z]+Error\b"
    output = await call(GrepTool(), sandbox, session, pattern=pattern, max_results=1000)
    assert output.metadata["truncated"] is False and output.metadata["matches"] > 10
    code, expected = await shell(sandbox, "grep -rnE '^class [A-Za-z]+Error\\b' src")
    assert code == 0
    assert sorted(text(output).splitlines()) == sorted(expected.splitlines())
    # case-insensitive, with a file glob, in a subdirectory: still grep's answer
    output = await call(
        GrepTool(),
        sandbox,
        session,
        pattern="RAISES:",
        ignore_case=True,
        glob="*.py",
        path="src",
        max_results=1000,
    )
    code, expected = await shell(sandbox, "grep -rni --include='*.py' RAISES: src")
    assert code == 0 and len(expected.splitlines()) > 10
    assert sorted(text(output).splitlines()) == sorted(expected.splitlines())


async def test_glob_finds_what_find_finds_newest_first(sandbox: Sandbox, session: Session) -> None:
    tree = copy_real_tree(session)
    newest = tree / "call" / "pipeline.py"
    newest.touch()
    output = await call(GlobTool(), sandbox, session, pattern="**/*.py", path="src")
    code, expected = await shell(sandbox, "find src -name '*.py' -type f")
    assert code == 0 and sorted(text(output).splitlines()) == sorted(expected.splitlines())
    assert text(output).splitlines()[0] == "src/call/pipeline.py"


async def test_without_ripgrep_the_program_searches_itself(sandbox: Sandbox, session: Session) -> None:
    """Today's image has no rg: the fallback is what runs (and a later image's rg is used)."""
    (Path(session.workspace_path) / "a.txt").write_text("needle\n")
    code, _ = await shell(sandbox, "command -v rg")
    output = await call(GrepTool(), sandbox, session, pattern="needle")
    assert output.metadata["engine"] == ("python" if code != 0 else "rg")
    assert text(output) == "a.txt:1:needle"


async def test_gitignore_links_and_escapes_in_the_container(sandbox: Sandbox, session: Session) -> None:
    root = Path(session.workspace_path)
    (root / ".gitignore").write_text("node_modules/\n*.min.js\n")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "dep.js").write_text("needle\n")
    (root / "app.min.js").write_text("needle\n")
    (root / "app.js").write_text("needle\n")
    (root / "etc").symlink_to("/etc")  # a link out of the workspace: never followed
    found = await call(GrepTool(), sandbox, session, pattern="needle|root")
    assert text(found) == "app.js:1:needle"
    globbed = await call(GlobTool(), sandbox, session, pattern="**/*")
    assert sorted(text(globbed).splitlines()) == [".gitignore", "app.js"]
    for path in ("etc", "/etc", "..", "etc/passwd"):
        with pytest.raises(WorkspaceEscapeError):
            await call(GrepTool(), sandbox, session, pattern="root", path=path)
        with pytest.raises(WorkspaceEscapeError):
            await call(GlobTool(), sandbox, session, pattern="*", path=path.rsplit("/passwd", 1)[0])


async def test_bounded_on_a_big_tree(
    sandbox: Sandbox, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5,000 files (bench/search_bench.py measures 20,000 and 100,000): results and time are bounded."""
    root = Path(session.workspace_path) / "big"
    for d in range(50):
        folder = root / f"d{d:02d}"
        folder.mkdir(parents=True)
        for f in range(100):
            (folder / f"f{f:03d}.txt").write_text(f"line one\nhit {d} {f}\n")
    output = await call(GrepTool(), sandbox, session, pattern="hit", max_results=50)
    lines = text(output).splitlines()
    assert len(lines) == 51 and lines[0] == "big/d00/f000.txt:2:hit 0 0" and "max_results=50" in lines[-1]
    globbed = await call(GlobTool(), sandbox, session, pattern="big/**/*.txt")
    assert globbed.metadata["total"] == 5000 and globbed.metadata["files"] == 200
    monkeypatch.setattr(run, "TIME_LIMIT", 0.0)
    partial = await call(GrepTool(), sandbox, session, pattern="never there")
    assert partial.metadata["timed_out"] is True and "results are partial" in text(partial)
