"""UploadFiles / DownloadFiles through the real gRPC server on Docker (issue 8 point 1): archives
are unpacked inside the sandbox by its agent, one hostile member per escape kind is refused with
nothing written anywhere, trees round-trip with bytes, modes and mtimes, and the tenant's grants
and disk quota hold."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from dispatcher.client import RequestFailed
from tests.integration.grpc.conftest import Start
from tests.server.conftest import base_config
from tests.server.helpers import text_of
from tests.server.rpc.test_trees import assert_same_tree, make_tree, member, tar_of

pytestmark = pytest.mark.docker


def _special(name: str, kind: bytes, **attrs: Any) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, None


HOSTILE: dict[str, tuple[str, list[tuple[tarfile.TarInfo, bytes | None]]]] = {
    "dotdot": ("../x", [member("../x")]),
    "absolute": ("/tmp/x", [member("/tmp/x")]),
    "symlink-then-file": ("lnk", [_special("lnk", tarfile.SYMTYPE, linkname="/tmp"), member("lnk/x")]),
    "hardlink": ("hard", [_special("hard", tarfile.LNKTYPE, linkname="/etc/passwd")]),
    "device": ("null", [_special("null", tarfile.CHRTYPE, devmajor=1, devminor=3)]),
    "fifo": ("pipe", [_special("pipe", tarfile.FIFOTYPE)]),
    "setuid": ("suid", [member("suid", b"#!/bin/sh\n", 0o4755)]),
    "setgid": ("sgid", [member("sgid", b"#!/bin/sh\n", 0o2755)]),
    "workspace-symlink": ("out/x", [member("out/x")]),
    "workspace-symlink-to-host": ("host/x", [member("host/x")]),
}


@pytest.mark.parametrize("kind", list(HOSTILE))
async def test_hostile_member_is_refused_and_nothing_is_written(
    start: Start, tmp_path: Path, kind: str, runtime: str
) -> None:
    harness = await start({"runtime": runtime})
    client = harness.client()
    session = await client.create_session("h")
    sid = session.session_id
    workspace = Path(session.workspace_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    # Links already in the workspace: one made by the sandbox (to its /tmp), one to a host directory.
    assert not (
        await client.call(
            sid, "shell", {"command": "ln -s /tmp d/out 2>/dev/null || (mkdir d && ln -s /tmp d/out)"}
        )
    ).is_error
    (workspace / "d" / "host").symlink_to(outside)
    shown, members = HOSTILE[kind]
    with pytest.raises(RequestFailed) as info:
        await client.upload_tar(sid, [tar_of(member("ok.txt", b"fine"), *members)], "d")
    assert info.value.code == "INVALID_ARGUMENT", info.value
    assert shown in info.value.details, info.value.details
    assert sorted(p.name for p in (workspace / "d").iterdir()) == ["host", "out"]  # not even ok.txt
    assert list(outside.iterdir()) == [] and not (workspace / "x").exists()
    listing = await client.call(sid, "shell", {"command": "ls -A /tmp; ls -A /"})
    assert "x" not in text_of(listing).split() and "suid" not in text_of(listing)


@pytest.mark.parametrize(("key", "value"), [("mtime", "1e300"), ("mtime", "-1e300"), ("size", "9" * 40)])
async def test_a_number_out_of_range_is_the_clients_error_naming_its_member(
    start: Start, key: str, value: str
) -> None:
    """Issue 37 item 10: an out-of-range number in a member's header is INVALID_ARGUMENT naming
    the member, not UNAVAILABLE (an agent fault, which invites a retry that cannot help)."""
    harness = await start()
    client = harness.client()
    session = await client.create_session("n")
    info, data = member("d/far.txt", b"x")
    info.pax_headers = {key: value}
    with pytest.raises(RequestFailed) as caught:
        await client.upload_tar(session.session_id, [tar_of(member("ok.txt"), (info, data))], ".")
    assert caught.value.code == "INVALID_ARGUMENT", caught.value
    assert "d/far.txt" in caught.value.details and key in caught.value.details, caught.value.details
    assert list(Path(session.workspace_path).iterdir()) == []
    # The sandbox is the same one: nothing was blamed on it.
    assert not (await client.call(session.session_id, "shell", {"command": "true"})).is_error


async def test_round_trip_keeps_bytes_modes_mtimes_and_runs(
    start: Start, tmp_path: Path, runtime: str
) -> None:
    harness = await start({"runtime": runtime})
    client = harness.client()
    session = await client.create_session("rt")
    sid = session.session_id
    files = make_tree(tmp_path / "src")
    done = await client.upload(sid, str(tmp_path / "src"), "proj")
    assert done.files == 4 and done.bytes == sum(len(d) for d, _ in files.values())
    workspace = Path(session.workspace_path)
    assert_same_tree(files, workspace / "proj")
    uid = int(text_of(await client.call(sid, "shell", {"command": "id -u"})).strip())
    assert {p.stat().st_uid for p in (workspace / "proj").rglob("*")} == {uid}  # the sandbox user's
    ran = await client.call(
        sid, "shell", {"command": "./proj/bin/run.sh && cmp proj/data/blob.bin proj/data/blob.bin"}
    )
    assert not ran.is_error and "ran" in text_of(ran)
    # Made inside the sandbox, brought out: a symlink stays a link, a fifo is left out.
    await client.call(sid, "shell", {"command": "cd proj && ln -s README.md readme-link && mkfifo pipe"})
    got = await client.download(sid, "proj", str(tmp_path / "back"))
    assert got.files == 4 and not got.skipped
    assert_same_tree(files, tmp_path / "back")
    assert os.readlink(tmp_path / "back" / "readme-link") == "README.md"
    assert not (tmp_path / "back" / "pipe").exists()


async def test_limits_and_quota_are_clear_statuses(start: Start, tmp_path: Path) -> None:
    harness = await start(server={"max_upload_files": 10})
    client = harness.client()
    session = await client.create_session("q")
    workspace = Path(session.workspace_path)
    with pytest.raises(RequestFailed) as info:
        await client.upload_tar(session.session_id, [tar_of(*(member(f"f{i}") for i in range(20)))], "many")
    assert info.value.code == "RESOURCE_EXHAUSTED" and "max_upload_files" in info.value.details

    def big() -> Any:  # 80 MiB into a 64 MiB workspace
        info = tarfile.TarInfo("big.bin")
        info.size = 80 << 20
        yield info.tobuf(tarfile.PAX_FORMAT)
        for _ in range(80):
            yield os.urandom(1 << 20)
        yield bytes(1024)

    with pytest.raises(RequestFailed) as info:
        await client.upload_tar(session.session_id, big(), "full")
    assert info.value.code == "RESOURCE_EXHAUSTED" and "No space left" in info.value.details, info.value
    assert "quota" in info.value.details
    assert sorted(p.name for p in workspace.iterdir()) == []  # staging gone, the disk given back
    ok = await client.call(session.session_id, "shell", {"command": "head -c 40000000 /dev/zero > after.bin"})
    assert not ok.is_error, text_of(ok)


async def test_grants_apply_to_uploads_and_downloads(start: Start, tmp_path: Path) -> None:
    tenants = base_config(tmp_path)["tenants"]
    tenants[0] = {**tenants[0], "fs": [{"path": "pub", "mode": "r"}, {"path": "src", "mode": "rw"}]}
    harness = await start(tenants=tenants)
    client = harness.client()
    session = await client.create_session("g")
    root = Path(session.workspace_path)
    uid = int(text_of(await client.call(session.session_id, "shell", {"command": "id -u"})).strip())
    for sub in ("pub", "src", "secret"):
        (root / sub).mkdir(exist_ok=True)  # the grants' directories may exist already
        os.chown(root / sub, uid, -1)
    (root / "pub" / "p.txt").write_text("public\n")
    (root / "secret" / "s.txt").write_text("secret\n")
    await client.close_session(session.session_id)  # the next session mounts the grants as they are
    sid = (await client.create_session("g")).session_id
    archive = [tar_of(member("new.txt", b"new"))]
    done = await client.upload_tar(sid, archive, "src/in")
    assert done.files == 1 and (root / "src" / "in" / "new.txt").read_bytes() == b"new"
    for dest in ("pub", ".", "secret"):
        with pytest.raises(RequestFailed) as info:
            await client.upload_tar(sid, archive, dest)
        assert info.value.code == "PERMISSION_DENIED", (dest, info.value)
    assert not (root / "pub" / "new.txt").exists() and not (root / "new.txt").exists()
    got = await client.download(sid, "pub", str(tmp_path / "pub"))
    assert got.files == 1 and (tmp_path / "pub" / "p.txt").read_text() == "public\n"
    with pytest.raises(RequestFailed) as info:
        await client.download(sid, "secret", str(tmp_path / "secret"))
    assert info.value.code == "PERMISSION_DENIED"
    assert not (tmp_path / "secret").exists() or not list((tmp_path / "secret").iterdir())
