"""The search program's own rules: .gitignore lines, globs, and the two engines agreeing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatcher.tools.search import run
from dispatcher.tools.search.program import Budget, SearchError, compile_glob, ignored, parse_gitignore, walk


@pytest.mark.parametrize(
    ("lines", "path", "is_dir", "expected"),
    [
        ("*.log", "a.log", False, True),
        ("*.log", "deep/er/a.log", False, True),  # no slash: any depth
        ("/top.txt", "top.txt", False, True),
        ("/top.txt", "sub/top.txt", False, False),  # a leading slash anchors
        ("doc/*.md", "doc/a.md", False, True),
        ("doc/*.md", "x/doc/a.md", False, False),  # a middle slash anchors too
        ("build/", "build", True, True),
        ("build/", "build", False, False),  # a trailing slash: directories only
        ("**/cache", "a/b/cache", True, True),
        ("a/**/z", "a/z", False, True),
        ("a/**/z", "a/b/c/z", False, True),
        ("*.log\n!keep.log", "keep.log", False, False),  # the last match wins
        ("# comment\n\n\\#hash", "#hash", False, True),
        ("[ab].txt", "b.txt", False, True),
        ("[!ab].txt", "c.txt", False, True),
        ("[!ab].txt", "a.txt", False, False),
    ],
)
def test_gitignore_lines(lines: str, path: str, is_dir: bool, expected: bool) -> None:
    assert ignored([("", parse_gitignore(lines))], path, is_dir) is expected


def test_a_nested_gitignore_applies_below_its_directory_only(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / ".gitignore").write_text("*.tmp\n")
    for name in ("a.tmp", "sub/b.tmp", "sub/c.txt"):
        (tmp_path / name).write_text("")
    assert sorted(walk(str(tmp_path), ".", Budget(60))) == ["a.tmp", "sub/.gitignore", "sub/c.txt"]
    assert sorted(walk(str(tmp_path), "sub", Budget(60))) == ["sub/.gitignore", "sub/c.txt"]


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("**/*.py", ["a.py", "x/y/a.py"], ["a.pyc", "x/a.txt"]),
        ("*.py", ["a.py"], ["x/a.py"]),
        ("src/*.{ts,tsx}", ["src/a.ts", "src/b.tsx"], ["src/a.js", "src/x/a.ts"]),
        ("a?c", ["abc"], ["ac", "a/c"]),
        ("**", ["a", "a/b/c"], []),
    ],
)
def test_glob_patterns(pattern: str, yes: list[str], no: list[str]) -> None:
    regex = compile_glob(pattern)
    assert all(regex.fullmatch(p) for p in yes) and not any(regex.fullmatch(p) for p in no)


def test_an_unbalanced_brace_is_a_bad_glob() -> None:
    with pytest.raises(SearchError) as info:
        compile_glob("*.{a,b")
    assert info.value.code == "bad_glob"


def _serve(root: Path, engine: str, request: dict[str, Any], path_env: str | None = None) -> dict[str, Any]:
    body = {"root": str(root), "path": ".", "time_limit": 30, "max_line": 500, "engine": engine, **request}
    env = {**os.environ, run.REQUEST_VAR: json.dumps(body)}
    if path_env is not None:
        env["PATH"] = path_env
    done = subprocess.run(
        [sys.executable, "-I", "-"],
        input=run.program(),
        env=env,
        capture_output=True,
        check=True,
        timeout=60,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.mark.skipif(
    shutil.which("rg") is None, reason="no rg on this host: the ripgrep engine is not exercised"
)
def test_ripgrep_and_the_fallback_agree(tmp_path: Path) -> None:
    files = {
        ".gitignore": "dist/\n*.min.js\n!keep.min.js\n",
        "src/a.py": "import os\nneedle = 1\n\n\nprint(needle)\n",
        "src/b.ts": "const Needle = 2;\n",
        "dist/out.js": "needle\n",
        "app.min.js": "needle\n",
        "keep.min.js": "needle\n",
        ".hidden/c.txt": "needle\n",
    }
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    (tmp_path / "link.py").symlink_to("src/a.py")
    requests: list[dict[str, Any]] = [
        {"op": "grep", "pattern": "needle", "max_results": 100},
        {"op": "grep", "pattern": "needle", "ignore_case": True, "context_lines": 1, "max_results": 100},
        {"op": "grep", "pattern": "needle", "glob": "*.py", "max_results": 100},
        {"op": "glob", "pattern": "**/*", "max_results": 100},
    ]
    for request in requests:
        by_rg, by_python = _serve(tmp_path, "rg", request), _serve(tmp_path, "python", request)
        assert by_rg["engine"] == "rg" and by_python["engine"] == "python"
        key = "lines" if request["op"] == "grep" else "paths"
        assert by_rg[key] == by_python[key], request


def test_the_program_is_python_3_9_syntax_and_stdlib_only() -> None:
    """It runs on any image's python3 the agent accepts (>= 3.9), with nothing installed."""
    import ast

    tree = ast.parse(run.program(), feature_version=(3, 9))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_a_tree_deeper_than_the_recursion_limit_is_walked(tmp_path: Path) -> None:
    levels = [tmp_path / "deep"]
    for _ in range(1100):  # past Python's default recursion limit of 1,000 (made one by one: so is mkdir's)
        levels.append(levels[-1] / "d")
    for level in levels:
        level.mkdir()
    (levels[-1] / "bottom.txt").write_text("needle\n")
    try:
        answer = _serve(tmp_path, "python", {"op": "glob", "pattern": "**/bottom.txt", "max_results": 10})
        assert answer["paths"] == ["deep/" + "d/" * 1100 + "bottom.txt"]
    finally:  # bottom up: a recursive removal would stop at the same limit
        (levels[-1] / "bottom.txt").unlink()
        for level in reversed(levels):
            level.rmdir()


def test_an_rg_that_fails_leaves_the_search_to_the_walk(tmp_path: Path) -> None:
    """An image's rg too old for an option (or broken): the answer still comes, from the walk."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "rg").write_text(
        "#!/bin/sh\necho \"error: unexpected argument '--no-require-git'\" >&2\nexit 2\n"
    )
    (tools / "rg").chmod(0o755)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("needle\n")
    path_env = f"{tools}:{os.environ.get('PATH', '')}"
    requests: list[dict[str, Any]] = [
        {"op": "grep", "pattern": "needle", "max_results": 10},
        {"op": "glob", "pattern": "*.txt", "max_results": 10},
    ]
    for request in requests:
        answer = _serve(tree, "auto", request, path_env)
        assert answer["engine"] == "python" and "unexpected argument" in answer["rg_error"]
        assert answer.get("lines", answer.get("paths")) in ([["a.txt", 1, True, "needle"]], ["a.txt"])
