"""A real grpc.aio server on a free loopback port, in this test's event loop, with the local sandbox.

Three tenants: ``alpha`` (shell runs without asking, writes ask), ``beta`` (a neighbour, for
isolation tests) and ``tiny`` (one session, one dispatch at a time, read-only tools: for quotas and
allow-lists). Tests talk to it with ``AsyncDispatcherClient`` or, for the sync client and the CLI,
from a worker thread.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.client import AsyncDispatcherClient
from dispatcher.config import hash_token
from dispatcher.config.load import ensure_default_tenant, load_config
from dispatcher.server.app import DispatcherServer, build_server

TOKEN_ALPHA = "alpha-token-0123456789"
TOKEN_BETA = "beta-token-0123456789"
TOKEN_TINY = "tiny-token-0123456789"
ALL_MODES = ["cautious", "autonomous", "manual", "plan", "review", "audit"]


def base_config(tmp: Path) -> dict[str, Any]:
    return {
        "listen": "127.0.0.1:0",
        "home": str(tmp / "home"),
        "log": {"format": "text", "level": "warning"},
        "server": {"grace_seconds": 3},
        # A stop removes every session, container and quota mount (tests check they cleaned up);
        # sessions surviving a restart are tests/server/persistence/test_restart.py's.
        "shutdown": {"remove_sessions": True},
        "dispatcher": {"confirmation_timeout": 20},
        "sandbox": {"backend": "local"},
        "tools": ["tests.server.tools:make_echo_tool", "tests.server.tools:make_block_tool"],
        # Every mode, autonomous and audit included (by default only those that never lower the
        # policy's bar may be chosen: tests/server/policy/test_mode_limits.py).
        "approval_modes": ALL_MODES,
        "tenants": [
            {
                "id": "alpha",
                "token_sha256": [hash_token(TOKEN_ALPHA)],
                "workspace_root": str(tmp / "ws-alpha"),
                "tool_confirmation": {"default": {"EXECUTE": "auto"}},
            },
            {"id": "beta", "token_sha256": hash_token(TOKEN_BETA), "workspace_root": str(tmp / "ws-beta")},
            {
                "id": "tiny",
                "token_sha256": hash_token(TOKEN_TINY),
                "workspace_root": str(tmp / "ws-tiny"),
                "tools": ["read_file", "list_dir", "echo", "block"],
                "quotas": {"max_sessions": 1, "max_concurrent_dispatches": 1, "queue_timeout_seconds": 0},
            },
        ],
    }


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            deep_merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


@dataclass
class Harness:
    server: DispatcherServer
    tmp: Path
    clients: list[AsyncDispatcherClient] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def client(self, token: str | None = TOKEN_ALPHA) -> AsyncDispatcherClient:
        client = AsyncDispatcherClient(self.target, token=token or "", home=str(self.tmp / "nohome"))
        self.clients.append(client)
        return client


ServerFactory = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def make_server(tmp_path: Path) -> AsyncIterator[ServerFactory]:
    """Start a server with ``base_config`` deep-merged with the given overrides."""
    harnesses: list[Harness] = []

    async def start(**overrides: Any) -> Harness:
        data = deep_merge(base_config(tmp_path), overrides)
        path = tmp_path / f"config-{len(harnesses)}.yaml"
        path.write_text(yaml.safe_dump(data))
        config, _ = ensure_default_tenant(load_config(path, env={}))
        server = build_server(config)
        await server.start()
        harness = Harness(server, tmp_path)
        harnesses.append(harness)
        return harness

    yield start
    for h in harnesses:
        for c in h.clients:
            await c.close()
        await h.server.stop(grace=1)


@pytest.fixture
async def harness(make_server: ServerFactory) -> Harness:
    return await make_server()
