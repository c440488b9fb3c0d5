"""Tenant identity on the real Docker backend, through the gRPC server.

Each tenant's sandboxes run as the tenant's own host uid, so a per-user kernel limit one tenant
exhausts (inotify instances) is not the other's; and a symlink a sandbox plants to leave its fs
grant is refused before the call runs, with nothing dispatched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import docker
import pytest
import yaml

from dispatcher.config import hash_token
from dispatcher.config.load import load_config
from dispatcher.core import ToolErrorClass
from dispatcher.core.events import bus as ev
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.server.app import build_server
from tests.integration.conftest import ProviderFactory
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, Harness, base_config, deep_merge
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker

TOKEN_GAMMA = "gamma-token-0123456789"
AUTO = {"default": {"EXECUTE": "auto", "WRITE": "auto"}}

# Holds as many inotify instances as one uid may have (max_user_instances), then stays alive.
HOLD = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
try:
    limit = int(open("/proc/sys/fs/inotify/max_user_instances").read())
except OSError:
    limit = 128
fds = []
while len(fds) < limit:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
open("/tmp/held.tmp", "w").write("%d %d" % (len(fds), limit))
os.rename("/tmp/held.tmp", "/tmp/held")
time.sleep(3600)
"""
INIT = "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.inotify_init1(0), ctypes.get_errno())"

Serve = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def serve(
    make_provider: ProviderFactory, docker_client: docker.DockerClient, tmp_path: Path
) -> AsyncIterator[Serve]:
    """Start a docker-backed server with tenants alpha and beta (shell runs unasked) and gamma
    (fs grants: pub read-only, src read-write)."""
    harnesses: list[Harness] = []

    async def start(runtime: str | None = None) -> Harness:
        if runtime is not None and runtime not in (docker_client.info().get("Runtimes") or {}):
            pytest.skip(f"runtime {runtime} is not configured in the Docker daemon")
        data: dict[str, Any] = deep_merge(base_config(tmp_path), {"sandbox": {"backend": "docker"}})
        data["tenants"] = [
            {"id": "alpha", "token_sha256": hash_token(TOKEN_ALPHA), "tool_confirmation": AUTO},
            {"id": "beta", "token_sha256": hash_token(TOKEN_BETA), "tool_confirmation": AUTO},
            {
                "id": "gamma",
                "token_sha256": hash_token(TOKEN_GAMMA),
                "tool_confirmation": AUTO,
                "fs": [{"path": "pub", "mode": "r"}, {"path": "src", "mode": "rw"}],
            },
        ]
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        config = load_config(path, env={})
        sandbox = SandboxConfig(runtime=runtime)
        server = build_server(config, provider=lambda hooks: make_provider(sandbox, hooks=hooks))
        await server.start()
        harness = Harness(server, tmp_path)
        harnesses.append(harness)
        return harness

    yield start
    for harness in harnesses:
        for client in harness.clients:
            await client.close()
        await harness.server.stop(grace=1)


async def _shell(client: Any, session_id: str, command: str) -> str:
    result = await client.call(session_id, "shell", {"command": command, "timeout_seconds": 60})
    assert not result.is_error, text_of(result)
    return text_of(result)


@pytest.mark.parametrize("runtime", [None, "runsc"], ids=["runc", "runsc"])
async def test_one_tenant_cannot_exhaust_anothers_inotify_instances(
    serve: Serve, runtime: str | None
) -> None:
    harness = await serve(runtime)
    alpha, beta = harness.client(TOKEN_ALPHA), harness.client(TOKEN_BETA)
    a = await alpha.create_session("w")
    b = await beta.create_session("w")
    uid_a = int(await _shell(alpha, a.session_id, "id -u"))
    uid_b = int(await _shell(beta, b.session_id, "id -u"))
    assert uid_a != uid_b and 0 not in (uid_a, uid_b)
    assert uid_a == harness.server.tenants.get("alpha").uid

    await _shell(alpha, a.session_id, f"python3 -c '{HOLD}' >/dev/null 2>&1 &")
    held = "waiting"

    async def reported() -> bool:
        nonlocal held
        held = (await _shell(alpha, a.session_id, "cat /tmp/held 2>/dev/null || echo waiting")).strip()
        return held != "waiting"

    await until(reported, "the inotify holder to report", timeout=30)
    count, limit = map(int, held.split())
    assert count == limit  # alpha holds every instance its uid may have

    fd, err = map(int, (await _shell(beta, b.session_id, f"python3 -c '{INIT}'")).split())
    assert fd >= 0, f"beta's inotify_init failed with errno {err} while alpha holds {count}"


async def test_a_planted_link_out_of_the_grant_is_refused_before_the_call_runs(serve: Serve) -> None:
    harness = await serve()
    gamma = harness.client(TOKEN_GAMMA)
    session = await gamma.create_session("w")
    sid = session.session_id
    await _shell(gamma, sid, "mkdir -p src && ln -s ../secret src/docs && ln -s ../pub src/up")
    events: list[Any] = []
    read = await gamma.call(sid, "read_file", {"path": "src/docs/key"}, on_event=events.append)
    write = await gamma.call(
        sid, "write_file", {"path": "src/up/new", "content": "x"}, on_event=events.append
    )
    for result in (read, write):
        assert result.is_error and result.error_class is ToolErrorClass.PERMISSION_DENIED, text_of(result)
        assert "not granted" in text_of(result)
    assert ev.TOOL_CALLED not in [e.type for e in events]
    audit = [json.loads(line) for line in (harness.tmp / "home" / "audit.jsonl").read_text().splitlines()]
    denied = [r for r in audit if r.get("tool") in ("read_file", "write_file")]
    assert [(r["kind"], r["decision"]) for r in denied] == [("tool.call.denied", "fs_denied")] * 2
    # The agent itself refuses too, for a call that never went through the server's check.
    sandbox = harness.server.provider.sandbox_for(
        harness.server.sessions.get(harness.server.tenants.get("gamma"), sid).session
    )
    with pytest.raises(PermissionError):
        await sandbox.read("src/docs/key")
    ok = await gamma.call(sid, "write_file", {"path": "src/fine", "content": "x"})
    assert not ok.is_error, text_of(ok)
