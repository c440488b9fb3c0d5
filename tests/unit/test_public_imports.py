"""The server uses other packages through their public modules only (private ones change without notice)."""

from __future__ import annotations

import ast
from pathlib import Path

import dispatcher

ROOT = Path(dispatcher.__file__).parent


def _private_imports() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if "v1" in path.relative_to(ROOT).parts[:1]:
            continue  # generated protobuf code
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] != "dispatcher" and any(p.startswith("_") and p != "__future__" for p in parts):
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {name}")
    return found


def test_no_private_modules_of_other_packages_are_imported() -> None:
    assert _private_imports() == [], "import the public module instead (e.g. grpc_health.v1.health.aio)"
