"""The Node.js example (examples/node) against a live ``dispatcher serve``: the polyglot claim, tested.

Needs ``node``; runs ``npm ci --prefix examples/node`` itself when the dependencies are missing.
Skipped without node (or when npm cannot install), except under CI=true, where that fails.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.node_example import EXAMPLE, node_with_deps
from tests.server.serve_process import start_serve


def test_node_client(tmp_path: Path) -> None:
    node = node_with_deps()
    # the default (cautious) policy: shell asks, and the Node client answers
    sp = start_serve(tmp_path, confirmation={})
    try:
        env = {**os.environ, "DISPATCHER_TARGET": sp.target, "DISPATCHER_HOME": str(sp.home)}
        env.pop("DISPATCHER_TOKEN", None)
        run = subprocess.run(
            [node, str(EXAMPLE / "client.js")], env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        sp.close()
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tool.confirmation_requested" in run.stdout
    assert "uploaded 2 files" in run.stdout and "tree/run.sh" in run.stdout  # UploadFiles / DownloadFiles
    assert "processes: " in run.stdout  # ListProcesses (and NOT_FOUND for an unknown process)
    # per-session mode; cautious: the default approval_modes does not let a caller choose autonomous
    assert "plan approved: 1 step(s), now APPROVAL_MODE_CAUTIOUS" in run.stdout
    assert "OK" in run.stdout.splitlines()[-1]
