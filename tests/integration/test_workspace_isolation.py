"""Workspace pinning without mount(2) (verified after start) and the usage watcher (marker ``docker``)."""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from dispatcher.core.errors import ToolError
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.docker.workspace_volume import WorkspaceQuotaExceeded, mount_entry
from dispatcher.sandbox.workspace_pin import Stage
from tests.integration.conftest import SANDBOX_IDS, ProviderFactory
from tests.integration.helpers import run, runsc_available

pytestmark = pytest.mark.docker


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> str:
    if request.param == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    return str(request.param)


def _session(root: Path, name: str, tenant: str = "t") -> Session:
    (root / name).mkdir(parents=True, exist_ok=True)
    for part in (name, *(str(p) for p in Path(name).parents if str(p) != ".")):
        os.chown(root / part, *SANDBOX_IDS)  # the developer's (sandbox user's) own workspace
    return Session(
        session_id=f"s-{name.replace('/', '-')}-{os.urandom(3).hex()}",
        workspace_path=str(root / name),
        tenant_id=tenant,
        workspace_root=os.path.realpath(root),
        workspace_name=name,
    )


async def test_without_mount_the_container_view_is_verified(
    make_provider: ProviderFactory, tmp_path: Path, runtime: str
) -> None:
    provider = make_provider(SandboxConfig(runtime=runtime))
    provider.launcher.can_mount = False  # as a server that is not root
    session = _session(tmp_path / "root", "w")
    ran = await run(provider.sandbox_for(session), "echo hi > f && cat f")
    assert ran.result.exit_code == 0 and ran.out == "hi\n"


async def test_without_mount_a_swap_after_the_walk_is_caught(
    make_provider: ProviderFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> None:
    provider = make_provider(SandboxConfig(runtime=runtime))
    provider.launcher.can_mount = False
    root = tmp_path / "root"
    session = _session(root, "w/x")
    host = tmp_path / "host-dir"
    host.mkdir()
    (host / "secret.txt").write_text("host secret\n")
    before = os.stat(host)
    original = Stage.use_paths

    def swap_then_use(stage: Stage, **kw: bool) -> None:
        # What another sandbox of the tenant may do between the walk and Docker's use of the path.
        if (root / "w" / "x").is_dir() and not (root / "w" / "x").is_symlink():
            os.rename(root / "w" / "x", root / "w" / "moved")
            os.symlink(host, root / "w" / "x")
        original(stage, **kw)

    monkeypatch.setattr(Stage, "use_paths", swap_then_use)
    with pytest.raises((SandboxError, ToolError)) as caught:
        await run(provider.sandbox_for(session), "cat /workspace/secret.txt")
    assert "symbolic link" in str(caught.value) or "changed" in str(caught.value)
    after = os.stat(host)
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)


async def test_watched_quota_stops_the_tenant(make_provider: ProviderFactory, tmp_path: Path) -> None:
    config = SandboxConfig(
        workspace_quota=8 << 20, workspace_quota_mode="watch", workspace_watch_interval_seconds=3600
    )
    provider = make_provider(config)
    from dispatcher.sandbox.docker.backend import DockerSandboxProvider

    provider = DockerSandboxProvider(config, instance=provider.instance, state_dir=str(tmp_path / "home"))
    make_provider.providers.append(provider)
    root = tmp_path / "root"
    await provider.prepare_tenants({"t": str(root)})
    entry = mount_entry(str(root.resolve()))
    assert entry is not None and {"nosuid", "nodev"} <= set(entry[2].split(","))
    session = _session(root, "w")
    sandbox = provider.sandbox_for(session)
    filled = await run(sandbox, "dd if=/dev/zero of=fill bs=1M count=16 2>/dev/null; echo done")
    assert filled.out == "done\n"

    assert await provider.scan_usage() == ["t"]
    assert sandbox.container_id is None  # its container was removed
    with pytest.raises(WorkspaceQuotaExceeded, match="over its workspace quota"):
        await run(sandbox, "true")
    await provider.aclose()
    assert mount_entry(str(root.resolve())) is None
