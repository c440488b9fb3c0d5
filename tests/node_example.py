"""The Node example's toolchain for tests: ``node``, and ``examples/node``'s dependencies, installed with
``npm ci`` from its lock file when one is missing. Skips without them, except under CI=true, where
that fails: CI installs them itself through these tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "node"
PACKAGES = ("@grpc/grpc-js", "@grpc/proto-loader", "@modelcontextprotocol/sdk")
"""What the example's scripts require: a node_modules made before one was added is installed again."""


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


def node_with_deps() -> str:
    """The ``node`` executable, once every package the example needs is installed."""
    node = shutil.which("node")
    if node is None:
        unavailable("node is not installed")
    if not all((EXAMPLE / "node_modules" / p).is_dir() for p in PACKAGES):
        npm = shutil.which("npm")
        if npm is None:
            unavailable("npm is not installed")
        cmd = [str(npm), "ci", "--prefix", str(EXAMPLE), "--no-audit", "--no-fund", "--loglevel=error"]
        installed = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if installed.returncode != 0:
            unavailable(f"npm ci failed: {installed.stderr[-500:]}")
    return node
