"""A real ``dispatcher serve`` subprocess on a free loopback port, for shutdown, CLI and Node tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.client import DispatcherClient

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
) -> ServeProcess:
    """Start ``python -m dispatcher.cli serve`` on a free port; return once it says it serves."""
    home = tmp / "home"
    config = tmp / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
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
    env = {**os.environ, "DISPATCHER_HOME": str(home), "PYTHONPATH": str(Path.cwd()), **(extra_env or {})}
    env.pop("DISPATCHER_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    target = None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        match = READY.search(line)
        if match:
            target = match.group(1)
            break
    if target is None:
        ServeProcess(proc, "", home, lines).close()
        pytest.fail("dispatcher serve did not start:\n" + "".join(lines))
    pump = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    pump.start()
    return ServeProcess(proc, target, home, lines, pump)
