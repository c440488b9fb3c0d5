"""Workspace isolation through the real gRPC server on Docker: pinned workspaces, disk quota,
nosuid/nodev, and fs grants enforced by the kernel (runc and runsc)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import docker
import pytest

from dispatcher.sandbox.container.labels import LABEL_SESSION
from dispatcher.sandbox.docker.workspace_volume import mount_entry
from tests.integration.grpc.conftest import Start
from tests.integration.helpers import containers_of
from tests.polling import until
from tests.server.conftest import Harness, base_config
from tests.server.helpers import text_of

pytestmark = pytest.mark.docker

QUOTA = 64 << 20


def host_dir(tmp_path: Path) -> tuple[Path, os.stat_result]:
    target = tmp_path / "host-dir"
    target.mkdir()
    (target / "secret.txt").write_text("host secret\n")
    return target, os.stat(target)


def session_containers(client: docker.DockerClient, harness: Harness, session_id: str) -> list[Any]:
    instance = harness.server.provider.instance  # type: ignore[attr-defined]
    return [c for c in containers_of(client, instance) if c.labels.get(LABEL_SESSION) == session_id]


# -- point 1: a workspace swapped for a symlink --------------------------------------------------


async def test_workspace_swapped_for_a_symlink_is_refused(start: Start, runtime: str, tmp_path: Path) -> None:
    harness = await start({"runtime": runtime})
    client = harness.client()
    target, before = host_dir(tmp_path)
    one = await client.create_session("w")
    assert not (await client.call(one.session_id, "shell", {"command": "mkdir x"})).is_error
    two = await client.create_session("w/x")
    swap = await client.call(one.session_id, "shell", {"command": f"rm -r x && ln -s {target} x"})
    assert not swap.is_error, text_of(swap)

    result = await client.call(two.session_id, "shell", {"command": "cat /workspace/secret.txt; id -u"})

    assert result.is_error
    assert "host secret" not in text_of(result)
    assert "symbolic link" in text_of(result), text_of(result)
    after = os.stat(target)
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)


async def test_recreated_container_does_not_follow_a_swapped_workspace(
    start: Start, runtime: str, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    harness = await start({"runtime": runtime, "idle_ttl_seconds": 1})
    client = harness.client()
    target, before = host_dir(tmp_path)
    one = await client.create_session("w")
    assert not (await client.call(one.session_id, "shell", {"command": "mkdir x"})).is_error
    two = await client.create_session("w/x")
    first = await client.call(two.session_id, "shell", {"command": "echo mine > f && ls"})
    assert not first.is_error and "f" in text_of(first)
    swap = await client.call(one.session_id, "shell", {"command": f"rm -r x && ln -s {target} x"})
    assert not swap.is_error, text_of(swap)
    # The idle reaper removes the container; the next call launches a new one.
    await until(lambda: not session_containers(docker_client, harness, two.session_id), timeout=30)

    result = await client.call(two.session_id, "shell", {"command": "cat /workspace/secret.txt"})

    assert result.is_error and "host secret" not in text_of(result)
    assert "symbolic link" in text_of(result), text_of(result)
    assert os.stat(target).st_uid == before.st_uid


# -- point 4 and 14: disk quota, nosuid/nodev ----------------------------------------------------


async def test_write_past_the_quota_gets_enospc(start: Start, runtime: str, tmp_path: Path) -> None:
    harness = await start({"runtime": runtime}, tool_confirmation={"default": {"WRITE": "auto"}})
    client = harness.client()
    session = await client.create_session("big")
    root = str((tmp_path / "ws-alpha").resolve())
    entry = mount_entry(root)
    assert entry is not None and entry[1] == "ext4"

    dd = await client.call(
        session.session_id, "shell", {"command": "dd if=/dev/zero of=fill bs=1M count=100"}
    )
    assert dd.is_error
    assert "No space left on device" in text_of(dd), text_of(dd)
    write = await client.call(
        session.session_id, "write_file", {"path": "more.txt", "content": "x" * 3_000_000}
    )
    assert write.is_error
    assert "quota" in text_of(write) and "64 MiB" in text_of(write), text_of(write)

    image = tmp_path / "home" / "volumes" / "alpha.img"
    assert image.stat().st_blocks * 512 <= QUOTA  # the host paid for the image, nothing more


async def test_workspace_root_is_nosuid_nodev(start: Start, tmp_path: Path) -> None:
    harness = await start()
    client = harness.client()
    session = await client.create_session("suid")
    made = await client.call(
        session.session_id, "shell", {"command": "cp /usr/bin/id ./suid-id && chmod 6755 ./suid-id && id -u"}
    )
    assert not made.is_error, text_of(made)
    sandbox_uid = text_of(made).strip().splitlines()[-1]
    root = str((tmp_path / "ws-alpha").resolve())
    entry = mount_entry(root)
    assert entry is not None
    options = set(entry[2].split(","))
    assert {"nosuid", "nodev"} <= options, entry
    binary = Path(root) / "suid" / "suid-id"
    assert binary.stat().st_mode & 0o4000  # the bit is there ...
    ran = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(binary), "-u"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.strip() == "65534" != sandbox_uid  # ... and has no effect on the host


# -- point 7 (kernel part): fs grants as mounts --------------------------------------------------


async def _grant_tree(client: Any, session_id: str, root: Path) -> None:
    """pub/ (readable), secret/ (not granted), pub/docs -> ../secret, all the sandbox user's."""
    uid = text_of(await client.call(session_id, "shell", {"command": "id -u"})).strip()
    for sub in ("pub", "secret"):
        (root / sub).mkdir()
        os.chown(root / sub, int(uid), -1)
    (root / "pub" / "p.txt").write_text("public\n")
    (root / "secret" / "s.txt").write_text("secret\n")
    (root / "pub" / "docs").symlink_to("../secret")


@pytest.mark.parametrize("whole", [None, "r"], ids=["grants-only", "workspace-read-only"])
async def test_shell_obeys_fs_grants(start: Start, runtime: str, tmp_path: Path, whole: str | None) -> None:
    grants = [{"path": "pub", "mode": "r"}, {"path": "src", "mode": "rw"}]
    if whole:
        grants.append({"path": ".", "mode": whole})
    tenants = base_config(tmp_path)["tenants"]
    tenants[0] = {
        **tenants[0],
        "fs": grants,
        "tool_confirmation": {"default": {"EXECUTE": "auto", "WRITE": "auto"}},
    }
    # A probe session without grants sets the tree up as the sandbox user would have.
    harness = await start({"runtime": runtime}, tenants=tenants)
    client = harness.client()
    session = await client.create_session("g")
    root = (tmp_path / "ws-alpha" / "g").resolve()

    async def sh(command: str) -> Any:
        return await client.call(session.session_id, "shell", {"command": command})

    await _grant_tree(client, session.session_id, root)
    await client.close_session(session.session_id)  # the next session mounts the tree as it is now
    session = await client.create_session("g")

    assert text_of(await sh("cat pub/p.txt")).strip() == "public"
    denied = await sh("echo no > pub/new.txt")
    assert denied.is_error and not (root / "pub" / "new.txt").exists()
    if runtime == "runc":
        assert "Read-only file system" in text_of(denied), text_of(denied)
    assert not (await sh("echo yes > src/new.txt")).is_error
    assert (root / "src" / "new.txt").read_text() == "yes\n"
    top = await sh("touch top.txt")
    assert top.is_error and not (root / "top.txt").exists()
    if whole is None:  # nothing but the grants is mounted: no secret, not even through a link
        assert (await sh("cat secret/s.txt")).is_error
        trick = await sh("cat pub/docs/s.txt")
        assert trick.is_error and "secret" not in text_of(trick)
        assert text_of(await sh("cd /workspace && echo *")).split() == ["pub", "src"]
