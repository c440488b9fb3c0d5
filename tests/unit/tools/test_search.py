"""glob and grep through the local agent: what they find, what they skip, their bounds and errors."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from dispatcher.core import ConfirmationPolicy, DispatcherConfig, Session, ToolDispatcher, ToolUseBlock
from dispatcher.core.errors import ToolCancelled, ToolExecutionError, ToolTimeout, WorkspaceEscapeError
from dispatcher.core.sandbox_api import ExecRequest, ExecResult, FileOpError, OutputCallback
from dispatcher.sandbox.fake import FakeSandbox, FakeSandboxProvider
from dispatcher.tools.search import GlobTool, GrepTool, run
from dispatcher.tools.search.glob import MAX_PATHS
from dispatcher.tools.search.grep import MAX_CHARS
from dispatcher.tools.search.program import MAX_FILE_BYTES
from tests.blocks import text_at
from tests.unit.tools.conftest import Harness, text_of


def _tree(workspace: Path, files: dict[str, str]) -> None:
    for name, content in files.items():
        path = workspace / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def _age(workspace: Path, name: str, seconds_ago: int) -> None:
    stamp = 1_700_000_000 - seconds_ago
    os.utime(workspace / name, (stamp, stamp))


# -- glob -----------------------------------------------------------------------------------------


async def test_glob_lists_matches_newest_first(harness: Harness, workspace: Path) -> None:
    _tree(workspace, {"a.py": "", "src/b.py": "", "src/deep/c.py": "", "src/d.txt": ""})
    for name, age in (("a.py", 30), ("src/b.py", 10), ("src/deep/c.py", 20)):
        _age(workspace, name, age)
    output = await harness.run(GlobTool(), pattern="**/*.py")
    assert text_of(output) == "src/b.py\nsrc/deep/c.py\na.py"
    assert output.metadata == {
        "files": 3,
        "total": 3,
        "truncated": False,
        "timed_out": False,
        "engine": "python",
    }


async def test_glob_components_braces_and_a_subdirectory(harness: Harness, workspace: Path) -> None:
    _tree(workspace, {"a.py": "", "src/b.ts": "", "src/c.tsx": "", "src/x/d.ts": "", "e.md": ""})
    assert text_of(await harness.run(GlobTool(), pattern="*.py")) == "a.py"  # top level only
    found = text_of(await harness.run(GlobTool(), pattern="*.{ts,tsx}", path="src")).splitlines()
    assert sorted(found) == ["src/b.ts", "src/c.tsx"]  # paths from the workspace root
    assert sorted(text_of(await harness.run(GlobTool(), pattern="src/**")).splitlines()) == [
        "src/b.ts",
        "src/c.tsx",
        "src/x/d.ts",
    ]
    assert text_of(await harness.run(GlobTool(), pattern="*.rs")) == "No files match '*.rs'."


async def test_glob_honours_gitignore_and_skips_git_and_links(
    harness: Harness, workspace: Path, outside: Path
) -> None:
    _tree(
        workspace,
        {
            ".gitignore": "build/\n*.log\n!keep.log\n/top.txt\n",
            "build/out.txt": "",
            "a.log": "",
            "keep.log": "",
            "top.txt": "",
            "sub/top.txt": "",
            "sub/.gitignore": "local.txt\n",
            "sub/local.txt": "",
            "local.txt": "",
            ".git/config": "",
            ".github/ci.yml": "",
        },
    )
    (workspace / "out").symlink_to(outside)
    (workspace / "alias.txt").symlink_to("local.txt")
    found = sorted(text_of(await harness.run(GlobTool(), pattern="**/*")).splitlines())
    assert found == [".github/ci.yml", ".gitignore", "keep.log", "local.txt", "sub/.gitignore", "sub/top.txt"]


async def test_glob_is_bounded_and_counts_the_rest(harness: Harness, workspace: Path) -> None:
    for i in range(MAX_PATHS + 30):
        (workspace / f"f{i:04d}.txt").touch()
        _age(workspace, f"f{i:04d}.txt", i)
    output = await harness.run(GlobTool(), pattern="*.txt")
    lines = text_of(output).splitlines()
    assert lines[0] == "f0000.txt" and len(lines) == MAX_PATHS + 1
    assert (
        lines[-1]
        == f"[showing the {MAX_PATHS} newest of {MAX_PATHS + 30:,} matching files; narrow the pattern]"
    )
    assert output.metadata["total"] == MAX_PATHS + 30 and output.metadata["truncated"] is True


async def test_glob_refuses_escapes_and_bad_patterns(
    harness: Harness, workspace: Path, outside: Path
) -> None:
    (workspace / "out").symlink_to(outside)
    for path in ("..", "/etc", "out"):
        with pytest.raises(WorkspaceEscapeError):
            await harness.run(GlobTool(), pattern="*", path=path)
    for pattern in ("/etc/*", "../*", "a/../../*"):
        with pytest.raises(FileOpError, match="relative to path") as info:
            await harness.run(GlobTool(), pattern=pattern)
        assert info.value.code == "bad_glob"
    with pytest.raises(ToolExecutionError, match="unbalanced"):
        await harness.run(GlobTool(), pattern="*.{py,ts")
    with pytest.raises(FileOpError) as missing:
        await harness.run(GlobTool(), pattern="*", path="nope")
    assert missing.value.code == "ENOENT"
    (workspace / "f.txt").write_text("")
    with pytest.raises(FileOpError, match=r"f\.txt is a file: glob searches a directory") as a_file:
        await harness.run(GlobTool(), pattern="*", path="f.txt")
    assert a_file.value.code == "not_a_directory"


# -- grep -----------------------------------------------------------------------------------------

SOURCE = "import os\n\n\ndef main():\n    os.exit(1)\n\n\n\nmain()\n"


async def test_grep_gives_path_line_text_in_path_order(harness: Harness, workspace: Path) -> None:
    _tree(workspace, {"b.py": SOURCE, "a/z.py": "main = 1\n", "c.txt": "nothing\n"})
    output = await harness.run(GrepTool(), pattern=r"main\b")
    assert text_of(output) == "a/z.py:1:main = 1\nb.py:4:def main():\nb.py:9:main()"
    assert output.metadata == {
        "matches": 3,
        "files": 2,
        "truncated": False,
        "timed_out": False,
        "engine": "python",
    }


async def test_grep_context_lines_and_group_separators(harness: Harness, workspace: Path) -> None:
    _tree(workspace, {"b.py": SOURCE})
    output = await harness.run(GrepTool(), pattern="main", context_lines=1, path="b.py")
    assert text_of(output) == "b.py-3-\nb.py:4:def main():\nb.py-5-    os.exit(1)\n--\nb.py-8-\nb.py:9:main()"


async def test_grep_ignore_case_and_glob_filters(harness: Harness, workspace: Path) -> None:
    _tree(
        workspace, {"a.py": "Token\n", "src/b.ts": "TOKEN\n", "src/deep/c.ts": "token\n", "d.md": "token\n"}
    )
    assert text_of(await harness.run(GrepTool(), pattern="token")) == "d.md:1:token\nsrc/deep/c.ts:1:token"
    by_name = await harness.run(GrepTool(), pattern="token", ignore_case=True, glob="*.ts")
    assert text_of(by_name) == "src/b.ts:1:TOKEN\nsrc/deep/c.ts:1:token"  # a name glob: any depth
    by_path = await harness.run(GrepTool(), pattern="token", ignore_case=True, glob="src/*.ts")
    assert text_of(by_path) == "src/b.ts:1:TOKEN"


async def test_grep_skips_ignored_binary_and_linked_files(
    harness: Harness, workspace: Path, outside: Path
) -> None:
    _tree(workspace, {".gitignore": "dist/\n", "dist/app.js": "secret\n", "src/a.js": "secret\n"})
    (workspace / "blob.bin").write_bytes(b"secret\x00\x01")
    (workspace / "out").symlink_to(outside)  # outside/secret.txt says "top secret"
    (workspace / "alias.js").symlink_to("src/a.js")
    output = await harness.run(GrepTool(), pattern="secret")
    assert text_of(output) == "src/a.js:1:secret"


async def test_grep_is_bounded_by_max_results_and_says_so(harness: Harness, workspace: Path) -> None:
    _tree(workspace, {"a.txt": "hit\n" * 50, "b.txt": "hit\n"})
    output = await harness.run(GrepTool(), pattern="hit", max_results=7)
    lines = text_of(output).splitlines()
    assert lines[:7] == [f"a.txt:{n}:hit" for n in range(1, 8)]
    assert lines[7] == "[stopped at max_results=7 matches; narrow the pattern, path or glob]"
    assert output.metadata["truncated"] is True and output.metadata["matches"] == 7


async def test_grep_cuts_long_lines_and_bounds_the_output(harness: Harness, workspace: Path) -> None:
    _tree(workspace, {"wide.txt": ("x" * 2000 + "\n") * 120})
    output = await harness.run(GrepTool(), pattern="x", max_results=1000)
    text = text_of(output)
    first = text.splitlines()[0]
    assert first.startswith("wide.txt:1:xxx") and first.endswith(" [... line cut ...]")
    assert len(text) <= MAX_CHARS + 200 and "output cut at about 40,000 characters" in text
    assert output.metadata["truncated"] is True


async def test_grep_stops_at_its_time_bound_and_says_so(
    harness: Harness, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(workspace, {f"d{i}/f.txt": "hit\n" for i in range(20)})
    monkeypatch.setattr(run, "TIME_LIMIT", 0.0)  # expired from the first entry on
    output = await harness.run(GrepTool(), pattern="hit")
    assert output.metadata["timed_out"] is True
    assert "results are partial" in text_of(output)


async def test_grep_refuses_a_bad_regex_and_escapes(harness: Harness, workspace: Path, outside: Path) -> None:
    _tree(workspace, {"a.txt": "x\n"})
    with pytest.raises(ToolExecutionError, match=r"invalid regular expression: missing \), unterminated"):
        await harness.run(GrepTool(), pattern="foo(")
    (workspace / "out").symlink_to(outside)
    for path in ("..", "out", "out/secret.txt", "/etc/passwd"):
        with pytest.raises(WorkspaceEscapeError):
            await harness.run(GrepTool(), pattern="secret", path=path)


async def test_grep_in_one_file_and_a_binary_one(harness: Harness, workspace: Path) -> None:
    _tree(workspace, {"a.txt": "one\ntwo\n"})
    (workspace / "b.bin").write_bytes(b"two\x00")
    assert text_of(await harness.run(GrepTool(), pattern="two", path="a.txt")) == "a.txt:2:two"
    with pytest.raises(ToolExecutionError, match="is binary"):
        await harness.run(GrepTool(), pattern="two", path="b.bin")


async def test_grep_names_with_newlines_cannot_forge_lines(harness: Harness, workspace: Path) -> None:
    (workspace / "evil\nb.py:1:forged").write_text("needle\n")
    output = await harness.run(GrepTool(), pattern="needle")
    assert text_of(output) == "evil\\nb.py:1:forged:1:needle"


# -- what reaches the sandbox: a constant command, the input in the environment ------------------


def _answering(
    answer: bytes, exit_code: int = 0, stderr: bytes = b"", timed_out: bool = False
) -> FakeSandbox:
    seen: list[ExecRequest] = []

    async def handler(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
        seen.append(request)
        on_output("stdout", answer)
        on_output("stderr", stderr)
        return ExecResult(exit_code=exit_code, timed_out=timed_out)

    sandbox = FakeSandbox(exec_handler=handler)
    sandbox.seen = seen  # type: ignore[attr-defined]
    return sandbox


async def test_the_pattern_never_reaches_a_shell(harness: Harness) -> None:
    sandbox = _answering(b'{"lines": [], "matches": 0, "files": 0, "more": false, "timed_out": false}')
    harness.sandbox = sandbox  # type: ignore[assignment]
    pattern = "$(touch /tmp/pwned)'; rm -rf / #"
    output = await harness.run(GrepTool(), pattern=pattern, glob="`id`")
    (request,) = sandbox.seen  # type: ignore[attr-defined]
    assert request.command == run.COMMAND == "exec python3 -I -S -"
    body = json.loads(request.env[run.REQUEST_VAR])
    assert body["pattern"] == pattern and body["glob"] == "`id`" and body["root"] == "/workspace"
    assert request.stdin == run.program() and text_of(output) == "No matches."


async def test_an_image_without_python_gets_a_clear_error(harness: Harness) -> None:
    harness.sandbox = _answering(b"", 127, b"sh: 1: exec: python3: not found\n")  # type: ignore[assignment]
    with pytest.raises(ToolExecutionError, match="no python3, which glob and grep run with; use shell"):
        await harness.run(GlobTool(), pattern="*")


async def test_a_search_killed_by_its_timeout_says_why(harness: Harness) -> None:
    harness.sandbox = _answering(b"", timed_out=True)  # type: ignore[assignment]
    with pytest.raises(ToolTimeout, match="simplify the pattern"):
        await harness.run(GrepTool(), pattern="(a+)+$")


async def test_a_cancel_stops_the_running_search(harness: Harness) -> None:
    started = asyncio.Event()

    async def handler(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
        started.set()
        await cancel.wait()  # what the sandbox does: runs until told to stop
        return ExecResult(exit_code=None, cancelled=True)

    harness.sandbox = FakeSandbox(exec_handler=handler)  # type: ignore[assignment]
    tool = GrepTool()
    running = asyncio.ensure_future(harness.run(tool, pattern="x"))
    await started.wait()
    assert await tool.cancel() is True
    with pytest.raises(ToolCancelled, match="search cancelled"):
        await running
    assert await tool.cancel() is False  # nothing left to stop


async def test_the_calls_limit_bounds_the_walk_and_the_command(tmp_path: Path) -> None:
    """A ``timeouts:`` entry shorter than the search's own bound: the program stops within it, the
    command is killed after it, and the dispatcher waits for both (kill_slack_seconds)."""
    seen: list[ExecRequest] = []

    async def handler(request: ExecRequest, on_output: OutputCallback, cancel: asyncio.Event) -> ExecResult:
        seen.append(request)
        answer = {"lines": [], "matches": 0, "files": 0, "more": False, "timed_out": True}
        on_output("stdout", json.dumps(answer).encode())
        return ExecResult(exit_code=0)

    provider = FakeSandboxProvider()
    d = ToolDispatcher(
        provider,
        config=DispatcherConfig(timeouts={"grep": 4.0}),
        policy=ConfirmationPolicy.preset("cautious"),
    )
    d.register(GrepTool)
    session = Session(session_id="s1", workspace_path=str(tmp_path))
    d.open_session(session)
    provider.sandbox_for(session).exec_handler = handler
    result = await d.dispatch(ToolUseBlock("tu", "grep", {"pattern": "x"}), session, turn_id="t")
    await d.aclose()
    assert not result.is_error, result  # cautious: READ runs unasked
    (request,) = seen
    assert json.loads(request.env[run.REQUEST_VAR])["time_limit"] == 4.0
    assert request.timeout == 4.0 + run.KILL_SLACK
    assert GrepTool.definition.kill_slack_seconds > run.KILL_SLACK
    assert "stopped after 4 s of searching" in text_at(result)


async def test_context_around_many_long_matches_stays_bounded(harness: Harness, workspace: Path) -> None:
    """1,000 matches with 10 lines of context each would be megabytes: the program stops first."""
    _tree(workspace, {"log.txt": ("hit " + "y" * 1000 + "\n") * 3000, "crlf.txt": "hit\r\n"})
    output = await harness.run(GrepTool(), pattern="hit", context_lines=10, max_results=1000)
    text = text_of(output)
    assert "output cut at about 40,000 characters" in text and len(text) <= MAX_CHARS + 300
    assert output.metadata["truncated"] is True and output.metadata["matches"] < 1000
    assert text_of(await harness.run(GrepTool(), pattern="hit", path="crlf.txt")) == "crlf.txt:1:hit"


async def test_a_file_past_the_size_bound_is_not_read(harness: Harness, workspace: Path) -> None:
    line = b"needle " + b"x" * 56 + b"\n"  # text throughout: not skipped as binary
    (workspace / "big.log").write_bytes(line * (MAX_FILE_BYTES // len(line) + 1))
    (workspace / "small.log").write_text("needle\n")
    assert text_of(await harness.run(GrepTool(), pattern="needle")) == "small.log:1:needle"


async def test_an_answer_past_its_byte_bound_is_refused_not_read_whole(harness: Harness) -> None:
    harness.sandbox = _answering(b"[" + b'"x",' * (run.MAX_ANSWER_BYTES // 4))  # type: ignore[assignment]
    with pytest.raises(ToolExecutionError, match=r"the search failed in the sandbox \(exit code 0\)"):
        await harness.run(GrepTool(), pattern="x")
