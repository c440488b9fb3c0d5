"""A real ``dispatcher serve`` subprocess on a free loopback port, for shutdown, CLI and Node tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.client import DispatcherClient

REPO = Path(__file__).resolve().parents[2]
READY = re.compile(r"serving on ([0-9.]+:\d+)")


@dataclass
class ServeProcess:
    proc: subprocess.Popen[str]
    target: str
    home: Path
    stderr: list[str]
    pump: threading.Thread | None = None

    def client(self) -> DispatcherClient:
        return DispatcherClient(self.target, home=str(self.home))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.pump is not None:
            self.pump.join(timeout=10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def start_serve(
    tmp: Path,
    *,
    grace: float = 10.0,
    confirmation: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
    data: dict[str, Any] | None = None,
) -> ServeProcess:
    """Start ``python -m dispatcher.cli serve`` on a free port; return once it says it serves.

    ``data``: the whole config file instead of the default one (local backend, EXECUTE auto).
    """
    home = tmp / "home"
    config = tmp / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            data
            if data is not None
            else {
                "sandbox": {"backend": "local"},
                "server": {"grace_seconds": grace},
                "log": {"format": "json", "level": "info"},
                "tool_confirmation": confirmation
                if confirmation is not None
                else {"default": {"EXECUTE": "auto"}},
                "tools": ["tests.server.tools:make_block_tool"],
            }
        )
    )
    env = {**os.environ, "DISPATCHER_HOME": str(home), "PYTHONPATH": str(REPO), **(extra_env or {})}
    env.pop("DISPATCHER_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    lines: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        # Reads until the process closes stderr, so a silent or stuck server cannot block the test.
        for line in stderr:
            lines.append(line)
            match = READY.search(line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    if not ready.wait(timeout=30) or not found:
        ServeProcess(proc, "", home, lines, reader).close()
        pytest.fail("dispatcher serve did not start:\n" + "".join(lines))
    return ServeProcess(proc, found[0], home, lines, reader)
