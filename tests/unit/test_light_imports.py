"""What importing a client costs: ``import dispatcher.client`` loads the data types of the core, not
the dispatch pipeline, its approval and review steps or ``jsonschema`` (a script that only calls a
server should start fast and not need what the server needs)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import dispatcher.core

HEAVY = (
    "dispatcher.core.call.pipeline",
    "dispatcher.core.call.approve",
    "dispatcher.core.call.review",
    "jsonschema",
)
ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    loaded: list[str] = json.loads(out)
    return loaded


def test_importing_the_client_loads_no_pipeline_approval_review_or_jsonschema() -> None:
    loaded = _loaded_after("import dispatcher.client")
    assert "dispatcher.client" in loaded
    heavy = [m for m in loaded if m in HEAVY or m.startswith("jsonschema.")]
    assert heavy == [], f"import dispatcher.client loads {heavy}"


def test_the_core_package_loads_its_names_when_first_used() -> None:
    loaded = _loaded_after("import dispatcher.core")
    assert [m for m in loaded if m.startswith("dispatcher.core.")] == []
    loaded = _loaded_after("from dispatcher.core import ToolDispatcher")
    assert "dispatcher.core.call.pipeline" in loaded


def test_the_core_packages_lazy_names_match_its_type_checking_imports() -> None:
    tree = ast.parse(Path(dispatcher.core.__file__).read_text(encoding="utf-8"))
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    typed = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert typed == dispatcher.core._LAZY
    assert sorted(dispatcher.core.__all__) == sorted(typed)
    for name, module in typed.items():
        assert getattr(dispatcher.core, name) is getattr(sys.modules[module], name), name
