"""A real gRPC server on loopback whose sessions' sandboxes are the fake one with an in-memory
process table (``memory_table.py``): the process RPCs, the Python clients and the CLI verbs are
tested against ``ProcessControl``'s contract, whatever sandbox implements it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.core.process_api import ProcessStart
from dispatcher.server.app import build_server
from tests.server.conftest import Harness, base_config, deep_merge
from tests.server.processes.memory_table import MemoryProcessTable, TableSandboxProvider


@dataclass
class ProcHarness:
    """The server, its backend, and a shortcut to a session's table."""

    harness: Harness
    provider: TableSandboxProvider

    def table(self, session_id: str) -> MemoryProcessTable:
        return self.provider.table(session_id)

    async def start(self, session_id: str, process_id: str, command: str = "serve") -> None:
        """Start a process as a tool would (``shell`` with ``background: true``)."""
        await self.table(session_id).start(ProcessStart(process_id, command, tool_use_id=f"tu_{process_id}"))


async def start_proc_server(tmp: Path, **overrides: Any) -> tuple[ProcHarness, Harness]:
    data = deep_merge(base_config(tmp), overrides)
    path = tmp / "config-processes.yaml"
    path.write_text(yaml.safe_dump(data))
    config, _ = ensure_default_tenant(load_config(path, env={}))
    provider = TableSandboxProvider()
    server = build_server(config, provider=lambda hooks: provider)
    await server.start()
    harness = Harness(server, tmp)
    return ProcHarness(harness, provider), harness


@pytest.fixture
async def procs(tmp_path: Path) -> AsyncIterator[ProcHarness]:
    ph, harness = await start_proc_server(tmp_path)
    yield ph
    for c in harness.clients:
        await c.close()
    await harness.server.stop(grace=1)
