"""README's Layout table describes the tree as it is: every path it names exists, every package and
top-level module of ``dispatcher/`` has a row, and every module a row names is in that package."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _rows() -> list[tuple[list[str], list[str]]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("path", "---"):
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+\.py)`", cells[1])))
    return rows


def test_every_path_the_table_names_exists() -> None:
    missing = [p for paths, _ in _rows() for p in paths if not list(REPO.glob(p.rstrip("/")))]
    assert not missing, f"README Layout names paths that do not exist: {missing}"


def test_every_module_a_package_row_names_is_in_that_package() -> None:
    stale = []
    for paths, modules in _rows():
        dirs = [REPO / p for p in paths if p.endswith("/")]
        files = [f for p in paths if not p.endswith("/") for f in REPO.glob(p)]
        for module in modules:
            here = any((d / module).is_file() for d in dirs) or any(f.name == module for f in files)
            if not here and not (REPO / module).is_file():
                stale.append(f"{paths}: {module}")
    assert not stale, f"README Layout names modules that are not there: {stale}"


def test_every_package_and_top_level_module_has_a_row() -> None:
    named = [p for paths, _ in _rows() for p in paths]
    covered_dirs = {(REPO / p).resolve() for p in named if p.endswith("/")}
    covered_files = {f.resolve() for p in named if not p.endswith("/") for f in REPO.glob(p)}
    packages = [
        p.parent
        for p in (REPO / "dispatcher").rglob("__init__.py")
        if "__pycache__" not in p.parts and p.parent != REPO / "dispatcher"
    ]
    missing = [str(p.relative_to(REPO)) for p in packages if p.resolve() not in covered_dirs]
    top = [
        p
        for p in (REPO / "dispatcher").glob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and p.resolve() not in covered_files
    ]
    missing += [str(p.relative_to(REPO)) for p in top]
    assert not missing, f"README Layout has no row for: {missing}"


DOCS = ("CONTRIBUTING.md", "docs/architecture.md")
"""The pages that walk a reader through the code: every module path they name must exist."""


def test_the_docs_name_only_paths_that_exist() -> None:
    stale = []
    for page in DOCS:
        text = (REPO / page).read_text(encoding="utf-8")
        for path in re.findall(r"`([\w./-]+/[\w.-]+\.py)`", text):
            if not any((base / path).is_file() for base in (REPO, REPO / "dispatcher")):
                stale.append(f"{page}: {path}")
    assert not stale, f"paths named in the docs that are not there: {stale}"
