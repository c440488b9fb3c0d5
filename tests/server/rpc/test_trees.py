"""UploadFiles / DownloadFiles through the real gRPC server on the local backend: both Python
clients, the CLI verbs, malformed streams, limits and the audit trail. The Docker-level cases
(hostile members, grants as mounts, the disk quota) are in tests/integration/grpc/test_trees_docker.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import grpc
import pytest

from dispatcher import cli
from dispatcher.cli.output import EXIT_BY_CODE, EXIT_USAGE
from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.server.conftest import TOKEN_ALPHA, Harness, ServerFactory
from tests.server.helpers import until

MTIME = 1_600_000_000


def make_tree(root: Path) -> dict[str, tuple[bytes, int]]:
    """A small project: text, a binary file with every byte value, an executable, nested dirs."""
    files = {
        "README.md": (b"# demo\n", 0o644),
        "data/blob.bin": (bytes(range(256)) * 64 + b"\x00\xff" * 1000, 0o600),
        "bin/run.sh": (b"#!/bin/sh\necho ran\n", 0o755),
        "a/b/c/deep.txt": (b"deep\n", 0o644),
    }
    for rel, (data, mode) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        os.utime(path, (MTIME, MTIME))
    (root / "empty").mkdir()
    os.utime(root / "a" / "b", (MTIME - 7, MTIME - 7))
    return files


def assert_same_tree(files: dict[str, tuple[bytes, int]], root: Path) -> None:
    for rel, (data, mode) in files.items():
        st = (root / rel).stat()
        assert (root / rel).read_bytes() == data, rel
        assert st.st_mode & 0o777 == mode, (rel, oct(st.st_mode))
        assert int(st.st_mtime) == MTIME, rel
    assert (root / "empty").is_dir()
    assert int((root / "a" / "b").stat().st_mtime) == MTIME - 7


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, data: bytes = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, MTIME
    return info, data


def audit_records(harness: Harness) -> list[dict[str, Any]]:
    path = harness.tmp / "home" / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_async_client_round_trip_keeps_bytes_modes_and_mtimes(harness: Harness, tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src")
    client = harness.client()
    session = await client.create_session("trees")
    done = await client.upload(session.session_id, str(tmp_path / "src"), "proj")
    assert (done.files, done.bytes) == (4, sum(len(d) for d, _ in files.values()))
    workspace = Path(session.workspace_path)
    assert_same_tree(files, workspace / "proj")
    assert not [p for p in (workspace / "proj").iterdir() if p.name.startswith(".~")]  # no staging left
    ran = await client.call(session.session_id, "shell", {"command": "./proj/bin/run.sh"})
    assert not ran.is_error and "ran" in str(ran.content)
    got = await client.download(session.session_id, "proj", str(tmp_path / "back"))
    assert got.files == 4 and not got.skipped
    assert_same_tree(files, tmp_path / "back")
    single = await client.download(session.session_id, "proj/bin/run.sh", str(tmp_path / "one"))
    assert single.files == 1 and os.access(tmp_path / "one" / "run.sh", os.X_OK)
    kinds = [
        (r["tool"], r["outcome"])
        for r in audit_records(harness)
        if r["tool"] in ("UploadFiles", "DownloadFiles") and r["kind"] == "tool.call.completed"
    ]
    assert kinds == [("UploadFiles", "ok"), ("DownloadFiles", "ok"), ("DownloadFiles", "ok")]
    upload = next(r for r in audit_records(harness) if r["tool"] == "UploadFiles" and "files" in r)
    assert upload["input"] == {"path": "proj"} and upload["files"] == 4 and upload["decision"] == "client"


async def test_sync_client_round_trip(harness: Harness, tmp_path: Path) -> None:
    files = make_tree(tmp_path / "src")
    session = await harness.client().create_session("sync")

    def work() -> None:
        with DispatcherClient(harness.target, token=TOKEN_ALPHA, home=str(tmp_path / "nohome")) as client:
            done = client.upload(session.session_id, str(tmp_path / "src"))
            assert done.files == 4
            got = client.download(session.session_id, ".", str(tmp_path / "back"))
            assert got.files == 4

    await asyncio.to_thread(work)
    assert_same_tree(files, Path(session.workspace_path))
    assert_same_tree(files, tmp_path / "back")


async def test_cli_upload_and_download(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISPATCHER_TOKEN", TOKEN_ALPHA)
    files = make_tree(tmp_path / "src")
    session = await harness.client().create_session("cli")
    sid = session.session_id

    async def run(*argv: str) -> int:
        return await asyncio.to_thread(cli.main, [argv[0], "--server", harness.target, *argv[1:]])

    assert await run("upload", sid, str(tmp_path / "src"), "in") == 0
    assert "uploaded 4 files" in capsys.readouterr().out
    assert await run("download", sid, "in", str(tmp_path / "out"), "--json") == 0
    assert json.loads(capsys.readouterr().out)["files"] == 4
    assert_same_tree(files, tmp_path / "out")
    (tmp_path / "src" / "link").symlink_to("../outside.txt")
    assert await run("upload", sid, str(tmp_path / "src")) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "symbolic link" in err and "link" in err and "inside the uploaded tree" in err
    assert await run("download", sid, "missing", str(tmp_path / "x")) == EXIT_BY_CODE["NOT_FOUND"]
    assert await run("upload", "ses_nope", str(tmp_path / "out")) == EXIT_BY_CODE["NOT_FOUND"]


async def _raw_upload(
    harness: Harness, requests: list[Any], token: str = TOKEN_ALPHA
) -> grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(harness.target) as channel:
        call = channel.stream_unary(
            "/dispatcher.v1.ToolDispatcher/UploadFiles",
            request_serializer=lambda r: r if isinstance(r, bytes) else r.SerializeToString(),
            response_deserializer=pb.UploadFilesResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(iter(requests), metadata=(("authorization", f"Bearer {token}"),))
    return info.value


async def test_malformed_streams_are_invalid_argument(harness: Harness) -> None:
    session = await harness.client().create_session("bad")
    target = pb.UploadFilesRequest(target=pb.UploadFilesTarget(session_id=session.session_id, path="d"))
    chunk = pb.UploadFilesRequest(chunk=tar_of(member("f")))
    cases = {
        "no target": [chunk],
        "two targets": [target, target],
        "not a tar": [target, pb.UploadFilesRequest(chunk=b"\x01" * 2000)],
        "cut short": [target, pb.UploadFilesRequest(chunk=tar_of(member("f", b"y" * 5000))[:1500])],
    }
    for name, requests in cases.items():
        err = await _raw_upload(harness, requests)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, err)
    assert not (Path(session.workspace_path) / "d").exists()
    empty = await _raw_upload(harness, [])
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT
    garbage = await _raw_upload(harness, [target, b"\x12\xff\xff\xff\xff"])  # a length past the end
    assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT and "does not parse" in garbage.details()
    stranger = await _raw_upload(harness, [target, chunk], token="not-a-token")
    assert stranger.code() == grpc.StatusCode.UNAUTHENTICATED
    unknown = pb.UploadFilesRequest(target=pb.UploadFilesTarget(session_id="ses_x", path="."))
    assert (await _raw_upload(harness, [unknown, chunk])).code() == grpc.StatusCode.NOT_FOUND


async def test_hostile_names_refused_naming_the_member(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session("hostile")
    workspace = Path(session.workspace_path)
    for bad in ("../escape.txt", "/abs.txt", "a/../../escape.txt"):
        with pytest.raises(RequestFailed) as info:
            await client.upload_tar(session.session_id, [tar_of(member("ok.txt"), member(bad))], "d")
        assert info.value.code == "INVALID_ARGUMENT" and bad in info.value.details, info.value
    assert not (workspace / "d").exists() and not (workspace.parent / "escape.txt").exists()
    assert audit_records(harness)[-1]["outcome"] == "TransferRefused"


def link(name: str, target: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, MTIME
    return info, None


async def test_a_tree_with_relative_links_inside_it_uploads_them_as_links(
    harness: Harness, tmp_path: Path
) -> None:
    """Issue 22 item 8: a tree holding symlinks that stay inside it uploads whole; each lands as a
    link (made, never followed), the files it names stay where they are."""
    files = make_tree(tmp_path / "src")
    (tmp_path / "src" / "readme-link").symlink_to("README.md")
    (tmp_path / "src" / "a" / "b" / "up").symlink_to("../../data")
    client = harness.client()
    session = await client.create_session("links")
    await client.upload(session.session_id, str(tmp_path / "src"), "in")
    dest = Path(session.workspace_path) / "in"
    assert os.readlink(dest / "readme-link") == "README.md"
    assert os.readlink(dest / "a" / "b" / "up") == "../../data"
    assert (dest / "a" / "b" / "up" / "blob.bin").read_bytes() == files["data/blob.bin"][0]
    result = await client.call(session.session_id, "read_file", {"path": "in/readme-link"})
    assert "# demo" in "".join(getattr(b, "text", "") for b in result.content)


async def test_links_leaving_the_upload_or_written_through_are_refused_naming_the_member(
    harness: Harness,
) -> None:
    client = harness.client()
    session = await client.create_session("bad-links")
    workspace = Path(session.workspace_path)
    cases: dict[str, list[tuple[tarfile.TarInfo, bytes | None]]] = {
        "out": [link("out", "../x")],
        "abs": [link("abs", "/etc")],
        "deep/sneaky": [link("deep/sneaky", "here/../../../x")],
        "dot/twice": [link("dot/self", "."), link("dot/twice", "self/../../x")],
        "via/file.txt": [link("via", "real"), member("via/file.txt")],  # never written through
    }
    for bad, members in cases.items():
        with pytest.raises(RequestFailed) as info:
            await client.upload_tar(session.session_id, [tar_of(member("ok.txt"), *members)], "d")
        assert info.value.code == "INVALID_ARGUMENT" and bad in info.value.details, (bad, info.value)
        assert not (workspace / "d").exists(), bad
    # The last member of a name wins: a file after a link of that name replaces the link itself.
    await client.upload_tar(
        session.session_id,
        [tar_of(member("target.txt", b"t"), link("l", "target.txt"), member("l", b"f"))],
        "e",
    )
    assert not (workspace / "e" / "l").is_symlink() and (workspace / "e" / "l").read_bytes() == b"f"
    assert (workspace / "e" / "target.txt").read_bytes() == b"t"


async def test_limits_are_clear_statuses(make_server: ServerFactory, tmp_path: Path) -> None:
    harness = await make_server(
        server={"max_upload_bytes": 64 << 10, "max_upload_files": 5, "max_download_bytes": 10_000}
    )
    client = harness.client()
    session = await client.create_session("limits")
    big = tar_of(member("big.bin", b"z" * (100 << 10)))
    with pytest.raises(RequestFailed) as info:
        await client.upload_tar(session.session_id, [big[i : i + 8192] for i in range(0, len(big), 8192)])
    assert info.value.code == "RESOURCE_EXHAUSTED" and "max_upload_bytes" in info.value.details
    many = tar_of(*(member(f"f{i}") for i in range(8)))
    with pytest.raises(RequestFailed) as info:
        await client.upload_tar(session.session_id, [many])
    assert info.value.code == "RESOURCE_EXHAUSTED" and "max_upload_files" in info.value.details
    assert not list(Path(session.workspace_path).iterdir())
    (Path(session.workspace_path) / "dl.bin").write_bytes(b"q" * 20_000)
    with pytest.raises(RequestFailed) as info:
        await client.download(session.session_id, "dl.bin", str(tmp_path / "dl"))
    assert info.value.code == "RESOURCE_EXHAUSTED" and "max_download_bytes" in info.value.details


async def test_abandoned_upload_leaves_nothing(harness: Harness) -> None:
    client = harness.client()
    session = await client.create_session("gone")
    workspace = Path(session.workspace_path)
    sent = asyncio.Event()
    archive = tar_of(member("a.txt", b"a" * 100_000), member("b.txt", b"b"))

    async def stalled() -> Any:
        yield archive[:60_000]  # a.txt is half sent...
        sent.set()
        await asyncio.Event().wait()  # ...and the client never sends more

    upload = asyncio.ensure_future(client.upload_tar(session.session_id, stalled(), "dest"))
    await sent.wait()
    await until(lambda: any(p.name.startswith(".~upload-") for p in (workspace / "dest").glob(".*")))
    upload.cancel()
    with pytest.raises(asyncio.CancelledError):
        await upload
    await until(lambda: not (workspace / "dest").exists())  # staging and the destination made for it
    done = await client.upload_tar(session.session_id, [archive], "dest")  # the session still works
    assert done.files == 2
