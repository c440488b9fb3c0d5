"""glob and grep (issue 34 part 2) on big trees, beside the same search run directly in the container.

A 100-file tree shows what a search costs however small the tree (a python3 start, the program on
its stdin). A 20,000-file tree (200 directories of 100 files, 1 in 100 holding the word searched for): the
``grep`` tool against ``grep -rn`` (and ``rg`` when the image has it) run as a command in the same
sandbox, so the difference is what the tool adds: its program's walk (``.gitignore``, no links),
the JSON answer and its formatting. Then the issue's 100,000-file tree: ``grep`` and ``glob`` stay
bounded (the note says whether the 30 s time bound was reached).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.env import BenchEnv
from bench.sandbox_bench import _context, _discard, _session
from bench.table import Row, row
from dispatcher.core.sandbox_api import ExecRequest, Sandbox
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.tools import GlobTool, GrepTool

GROUP = "search"
LINES = "".join(f"line {i} of an ordinary file\n" for i in range(20))


def _tree(root: Path, files: int) -> None:
    per_dir = 100
    for d in range(files // per_dir):
        folder = root / f"d{d:04d}"
        folder.mkdir(parents=True)
        for f in range(per_dir):
            extra = "the needle is here\n" if f == 0 else ""
            (folder / f"f{f:03d}.txt").write_text(LINES + extra)


async def _command(sandbox: Sandbox, command: str) -> int | None:
    result = await sandbox.exec(ExecRequest(command, timeout=120), _discard, asyncio.Event())
    return result.exit_code


async def _timed(runs: int, work: Callable[[], Awaitable[None]]) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await work()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def _one_tree(env: BenchEnv, provider: DockerSandboxProvider, files: int, runs: int) -> list[Row]:
    session = _session(env, f"search{files}")
    _tree(Path(session.workspace_path) / "tree", files)
    sandbox = provider.sandbox_for(session)
    context = _context(sandbox, session.workspace_path)
    await _command(sandbox, "true")  # the container is up before anything is timed
    has_rg = await _command(sandbox, "command -v rg >/dev/null") == 0
    last: dict[str, object] = {}

    async def grep_tool() -> None:
        output = await GrepTool().execute({"pattern": "needle", "max_results": 1000}, context)
        last.update(output.metadata)

    async def glob_tool() -> None:
        output = await GlobTool().execute({"pattern": "**/*.txt"}, context)
        last.update(output.metadata)

    async def grep_rn() -> None:
        if await _command(sandbox, "grep -rn needle tree >/dev/null") != 0:
            raise RuntimeError("grep -rn found nothing")

    async def rg_direct() -> None:
        if await _command(sandbox, "rg -n needle tree >/dev/null") != 0:
            raise RuntimeError("rg found nothing")

    rows: list[Row] = []
    label = f"{files:,} files"
    samples = await _timed(runs, grep_tool)
    note = f"engine {last.get('engine')}, {last.get('matches')} matches, timed_out={last.get('timed_out')}"
    rows.append(row(GROUP, f"grep tool, {label}", samples, note))
    rows.append(row(GROUP, f"grep -rn in the container, {label}", await _timed(runs, grep_rn)))
    if has_rg:
        rows.append(row(GROUP, f"rg in the container, {label}", await _timed(runs, rg_direct)))
    else:
        rows.append(Row(GROUP, f"rg in the container, {label}", None, note="no rg in this image"))
    samples = await _timed(runs, glob_tool)
    note = f"{last.get('total')} matched, timed_out={last.get('timed_out')}"
    rows.append(row(GROUP, f"glob tool **/*.txt, {label}", samples, note))
    await provider.close_session(session.session_id)
    return rows


async def measure(env: BenchEnv) -> list[Row]:
    """p50 of the grep tool vs grep -rn (and rg) in the container: 100 files (the tool's fixed cost:
    a python3 start and the program sent on stdin), 20k files; 100k files bounded."""
    provider = DockerSandboxProvider(SandboxConfig(), instance=env.instance)
    rows: list[Row] = []
    try:
        for files, runs in ((100, 10), (20_000, max(3, env.cold_iterations // 2)), (100_000, 2)):
            rows += await _one_tree(env, provider, files, runs)
    finally:
        await provider.aclose()
    return rows
