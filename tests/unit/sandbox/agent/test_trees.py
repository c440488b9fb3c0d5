"""The agent's tar ops (UploadFiles / DownloadFiles) on the local backend: all or nothing,
confinement without following links, kind clashes, and downloads that never follow a link."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatcher.core.errors import ToolPermissionDenied
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.transfer import TransferConflict, TransferLimits, TransferRefused, TransferTooLarge
from dispatcher.sandbox.local import LocalSandbox
from dispatcher.sandbox.transfer import AgentTreeTransport

LIMITS = TransferLimits()
MTIME = 1_600_000_000


def member(name: str, data: bytes | None = b"x", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = mode, MTIME
    if data is None:
        info.type = tarfile.DIRTYPE
    else:
        info.size = len(data)
    return info, data


def tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


async def chunks(data: bytes, size: int = 777) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


async def upload(sb: LocalSandbox, dest: str, *members: tuple[tarfile.TarInfo, bytes | None]) -> object:
    return await AgentTreeTransport().upload(sb, dest, chunks(tar_of(*members)), LIMITS)


def names(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_upload_in_small_chunks_with_duplicates_and_later_dirs(
    sandbox: LocalSandbox, workspace: Path
) -> None:
    summary = await upload(
        sandbox,
        "d",
        member("a/b.txt", b"first"),
        member("a/b.txt", b"second"),  # the last one wins
        member("./c.txt", b"c", 0o755),
        member("a", None, 0o750),  # a directory entry after its contents
    )
    assert summary.files == 2 and summary.bytes == len(b"first") + len(b"second") + 1  # type: ignore[attr-defined]
    assert (workspace / "d" / "a" / "b.txt").read_bytes() == b"second"
    assert (workspace / "d" / "a").stat().st_mode & 0o777 == 0o750
    assert int((workspace / "d" / "a").stat().st_mtime) == MTIME
    assert os.access(workspace / "d" / "c.txt", os.X_OK)
    assert names(workspace) == ["d", "d/a", "d/a/b.txt", "d/c.txt"]  # no staging directory left


async def test_refused_upload_writes_nothing_not_even_the_destination(
    sandbox: LocalSandbox, workspace: Path
) -> None:
    (workspace / "keep.txt").write_text("old")
    for bad in (member("x/../../up"), member("/etc/x"), member("s", b"#!", 0o4755)):
        with pytest.raises(TransferRefused):
            await upload(sandbox, "new/dir", member("keep.txt", b"new"), bad)
    with pytest.raises(TransferRefused, match="reserved"):
        await upload(sandbox, ".", member(".~upload-123/x"))
    assert names(workspace) == ["keep.txt"] and (workspace / "keep.txt").read_text() == "old"


def _with(
    info_and_data: tuple[tarfile.TarInfo, bytes | None], **pax: str
) -> tuple[tarfile.TarInfo, bytes | None]:
    info, data = info_and_data
    info.pax_headers = pax
    return info, data


def _gnu_tar_of(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    """GNU format: a number past its octal field is written in base-256, with no PAX header."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (_with(member("d/f.txt"), mtime="1e300"), "mtime"),
        (_with(member("d/f.txt"), mtime="-1e300"), "mtime"),
        (_with(member("d/f.txt", None), mtime="1e300"), "mtime"),  # a directory: set at the commit
        (_with(member("d/f.txt"), uid="-1"), "uid"),
        (_with(member("d/f.txt"), size="9" * 40), "size"),
    ],
    ids=["pax-mtime", "pax-mtime-negative", "pax-mtime-of-a-directory", "pax-uid", "pax-size"],
)
async def test_a_number_out_of_range_is_refused_naming_its_member(
    sandbox: LocalSandbox, workspace: Path, bad: tuple[tarfile.TarInfo, bytes | None], why: str
) -> None:
    """Issue 37 item 10: the client's bad input, not an agent fault (which the host retries)."""
    with pytest.raises(TransferRefused, match=rf"d/f\.txt: (PAX )?{why}"):
        await upload(sandbox, ".", member("ok.txt"), bad)
    assert names(workspace) == []


async def test_a_base256_mtime_out_of_range_is_refused_naming_its_member(
    sandbox: LocalSandbox, workspace: Path
) -> None:
    info, data = member("far.txt")
    info.mtime = 2**80
    with pytest.raises(TransferRefused, match=r"far\.txt: mtime"):
        await AgentTreeTransport().upload(sandbox, ".", chunks(_gnu_tar_of((info, data))), LIMITS)
    assert names(workspace) == []


async def test_existing_links_and_files_in_the_way(
    sandbox: LocalSandbox, workspace: Path, outside: Path
) -> None:
    before = sorted(outside.iterdir())
    (workspace / "link").symlink_to(outside)
    (workspace / "file").write_text("f")
    (workspace / "dir").mkdir()
    with pytest.raises(TransferRefused, match="symbolic link"):
        await upload(sandbox, ".", member("ok.txt"), member("link/x"))
    with pytest.raises(TransferConflict):
        await upload(sandbox, ".", member("ok.txt"), member("file/x"))
    with pytest.raises(TransferConflict):
        await upload(sandbox, ".", member("dir", b"a file where a directory is"))
    with pytest.raises(ToolPermissionDenied):  # the destination itself through a link to outside
        await upload(sandbox, "link", member("x"))
    assert sorted(outside.iterdir()) == before and not (workspace / "ok.txt").exists()
    # A link as the leaf is replaced, never written through.
    await upload(sandbox, ".", member("link", b"now a file"))
    assert (workspace / "link").read_bytes() == b"now a file" and sorted(outside.iterdir()) == before


async def test_upload_outside_the_workspace_is_denied(sandbox: LocalSandbox) -> None:
    with pytest.raises(ToolPermissionDenied):
        await upload(sandbox, "../elsewhere", member("x"))


async def test_limits(sandbox: LocalSandbox, workspace: Path) -> None:
    small = TransferLimits(max_upload_bytes=10_000, max_upload_files=2)
    transport = AgentTreeTransport()
    with pytest.raises(TransferTooLarge, match="max_upload_files"):
        await transport.upload(sandbox, ".", chunks(tar_of(member("a"), member("b"), member("c"))), small)
    with pytest.raises(TransferTooLarge, match="max_upload_bytes"):
        await transport.upload(sandbox, ".", chunks(tar_of(member("a", b"z" * 20_000))), small)
    assert names(workspace) == []


async def test_download_archives_links_as_links_and_skips_fifos(
    sandbox: LocalSandbox, workspace: Path, outside: Path
) -> None:
    (outside / "secret.txt").write_text("secret")
    (workspace / "t" / "sub").mkdir(parents=True)
    (workspace / "t" / "sub" / "f.txt").write_text("hello")
    (workspace / "t" / "out").symlink_to(outside)
    os.mkfifo(workspace / "t" / "pipe")
    async with AgentTreeTransport().download(sandbox, "t", LIMITS) as stream:
        data = b"".join([chunk async for chunk in stream])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["out", "sub", "sub/f.txt"]
        assert members["out"].issym() and members["out"].linkname == str(outside)
        f = tar.extractfile(members["sub/f.txt"])
        assert f is not None and f.read() == b"hello"
    assert b"secret" not in data
    with pytest.raises(FileOpError) as info:
        async with AgentTreeTransport().download(sandbox, "missing", LIMITS) as stream:
            pass
    assert info.value.code == "ENOENT"
    with pytest.raises(ToolPermissionDenied):
        async with AgentTreeTransport().download(sandbox, "t/out", LIMITS) as stream:
            pass


async def test_download_stops_at_the_limit(sandbox: LocalSandbox, workspace: Path) -> None:
    (workspace / "big.bin").write_bytes(b"b" * 50_000)
    with pytest.raises(TransferTooLarge, match="max_download_bytes"):
        async with AgentTreeTransport().download(sandbox, ".", TransferLimits(max_download_bytes=1000)) as s:
            async for _ in s:
                pass


async def test_deep_and_wide_archives(sandbox: LocalSandbox, workspace: Path) -> None:
    deep = "/".join(["d"] * 900) + "/leaf.txt"  # deeper than Python's recursion limit allows recursing
    wide = [member(f"w{i:04d}/f.txt") for i in range(700)]  # more directories than descriptors kept
    summary = await upload(sandbox, ".", member(deep, b"deep"), *wide)
    assert summary.files == 701  # type: ignore[attr-defined]
    assert (workspace / deep).read_bytes() == b"deep" and (workspace / "w0699" / "f.txt").exists()
    # Directories the archive did not list get the usual mode, not the staging area's 0700.
    assert (workspace / "w0000").stat().st_mode & 0o755 == 0o755
    with pytest.raises(TransferRefused, match="deep"):
        await upload(sandbox, "x", member("/".join(["d"] * 1100) + "/f"))


async def test_new_trees_move_whole_and_look_as_if_moved_file_by_file(
    sandbox: LocalSandbox, workspace: Path
) -> None:
    """A top-level directory the workspace does not have is moved in one rename; one it has is
    merged file by file. Either way: the archive's modes and times, and the mode a directory the
    archive does not list would have got."""
    (workspace / "dest" / "kept").mkdir(parents=True)
    (workspace / "dest" / "kept" / "old.txt").write_text("old")
    umask = os.umask(0)
    os.umask(umask)
    await upload(
        sandbox,
        "dest",
        member("new/listed", None, mode=0o750),
        member("new/listed/a.txt", b"a", mode=0o640),
        member("new/implicit/deeper/b.txt", b"b"),
        member("kept/c.txt", b"c"),
        member("top.txt", b"t"),
    )
    dest = workspace / "dest"
    assert names(dest) == [
        "kept",
        "kept/c.txt",
        "kept/old.txt",
        "new",
        "new/implicit",
        "new/implicit/deeper",
        "new/implicit/deeper/b.txt",
        "new/listed",
        "new/listed/a.txt",
        "top.txt",
    ]

    def mode(path: str) -> int:
        return (dest / path).stat().st_mode & 0o777

    assert mode("new/listed") == 0o750 and (dest / "new/listed").stat().st_mtime == MTIME
    assert mode("new") == mode("new/implicit") == mode("new/implicit/deeper") == 0o777 & ~umask
    assert mode("new/listed/a.txt") == 0o640 and (dest / "new/listed/a.txt").stat().st_mtime == MTIME
    assert (dest / "kept" / "old.txt").read_text() == "old" and (dest / "kept" / "c.txt").read_text() == "c"
    assert not [p for p in os.listdir(dest) if p.startswith(".")]  # no staging left
