"""The workspace file API (``WorkspaceFileAPI``): each operation, each ordinary error, the same
answers from every sandbox."""

from __future__ import annotations

import asyncio
import hashlib

from tests.contract.helpers import code_of, sh
from tests.contract.targets import Capability, Target


async def test_write_then_read_round_trips_text_and_bytes(target: Target) -> None:
    sb = target.sandbox
    await sb.write("notes.txt", "héllo\n")
    assert await sb.read("notes.txt") == "héllo\n"
    await sb.write_bytes("blob.bin", bytes(range(256)))
    assert await sb.read_bytes("blob.bin") == bytes(range(256))


async def test_write_makes_parent_directories(target: Target) -> None:
    await target.sandbox.write("a/b/c.txt", "deep")
    assert await target.sandbox.read("a/b/c.txt") == "deep"
    assert (await target.sandbox.stat("a/b")).kind == "dir"


async def test_write_replaces_the_whole_file(target: Target) -> None:
    await target.sandbox.write("f.txt", "a much longer first version\n")
    await target.sandbox.write("f.txt", "short\n")
    assert await target.sandbox.read("f.txt") == "short\n"


async def test_read_bytes_caps_at_max_bytes(target: Target) -> None:
    await target.sandbox.write("f.txt", "0123456789")
    assert await target.sandbox.read_bytes("f.txt", max_bytes=4) == b"0123"
    assert await target.sandbox.read_bytes("f.txt", max_bytes=100) == b"0123456789"


async def test_reading_a_missing_file_is_enoent(target: Target) -> None:
    assert await code_of(target.sandbox.read("missing.txt")) == "ENOENT"
    assert await code_of(target.sandbox.read_bytes("no/such/dir/file")) == "ENOENT"
    assert await code_of(target.sandbox.stat("missing.txt")) == "ENOENT"


async def test_reading_a_directory_is_eisdir(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "x")
    assert await code_of(target.sandbox.read("d")) == "EISDIR"


async def test_read_of_text_that_is_not_utf8_is_decode(target: Target) -> None:
    await target.sandbox.write_bytes("latin1.txt", "café".encode("latin-1"))
    assert await code_of(target.sandbox.read("latin1.txt")) == "decode"
    assert await target.sandbox.read_bytes("latin1.txt") == "café".encode("latin-1")


async def test_writing_under_a_file_is_enotdir(target: Target) -> None:
    await target.sandbox.write("plain", "x")
    assert await code_of(target.sandbox.write("plain/child.txt", "y")) == "ENOTDIR"
    assert await target.sandbox.read("plain") == "x"


async def test_writing_over_a_directory_is_eisdir(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "x")
    assert await code_of(target.sandbox.write("d", "y")) == "EISDIR"
    assert await target.sandbox.read("d/f.txt") == "x"


async def test_append_creates_then_extends(target: Target) -> None:
    await target.sandbox.append("log.txt", "one\n")
    await target.sandbox.append("log.txt", "two\n")
    assert await target.sandbox.read("log.txt") == "one\ntwo\n"


async def test_patch_replaces_the_one_occurrence_or_changes_nothing(target: Target) -> None:
    sb = target.sandbox
    await sb.write_bytes("p.txt", b"a = 1\r\nb = 2\r\nb = 2\r\n")
    await sb.patch("p.txt", "a = 1\nb = 2", "a = 0\nb = 2")  # plain newlines match the CRLF lines
    assert await sb.read_bytes("p.txt") == b"a = 0\r\nb = 2\r\nb = 2\r\n"
    assert await code_of(sb.patch("p.txt", "b = 2", "b = 3")) == "multiple_matches"
    assert await code_of(sb.patch("p.txt", "c = 3", "c = 4")) == "no_match"
    assert await code_of(sb.patch("missing.txt", "a", "b")) == "ENOENT"
    assert await sb.read_bytes("p.txt") == b"a = 0\r\nb = 2\r\nb = 2\r\n"


async def test_patch_replace_all_replaces_every_occurrence_and_counts(target: Target) -> None:
    sb = target.sandbox
    await sb.write_bytes("r.txt", b"b = 2\r\nb = 2\r\nc = 2\r\n")
    assert await sb.patch("r.txt", "b = 2\n", "b = 3\n", replace_all=True) == 2  # CRLF kept
    assert await sb.read_bytes("r.txt") == b"b = 3\r\nb = 3\r\nc = 2\r\n"
    assert await code_of(sb.patch("r.txt", "z", "y", replace_all=True)) == "no_match"
    assert await sb.read_bytes("r.txt") == b"b = 3\r\nb = 3\r\nc = 2\r\n"


async def test_exists_for_files_directories_and_nothing(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "x")
    assert await target.sandbox.exists("d/f.txt")
    assert await target.sandbox.exists("d")
    assert await target.sandbox.exists(".")
    assert not await target.sandbox.exists("d/missing")
    assert not await target.sandbox.exists("missing/deeper")


async def test_stat_of_a_file_and_a_directory(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "12345")
    st = await target.sandbox.stat("d/f.txt")
    assert (st.kind, st.size, st.path) == ("file", 5, target.path("d/f.txt"))
    assert st.mode & 0o600 == 0o600  # the sandbox's user reads and writes what it wrote
    assert (await target.sandbox.stat("d")).kind == "dir"
    root = await target.sandbox.stat(".")
    assert (root.kind, root.path) == ("dir", target.sandbox.workspace_root.rstrip("/"))


async def test_list_is_sorted_with_kinds_and_sizes(target: Target) -> None:
    await target.sandbox.write("d/b.txt", "bb")
    await target.sandbox.write("d/a.txt", "a")
    await target.sandbox.write("d/sub/c.txt", "c")
    listing = await target.sandbox.list("d")
    assert not listing.truncated
    assert [(e.name, e.kind) for e in listing.entries] == [
        ("a.txt", "file"),
        ("b.txt", "file"),
        ("sub", "dir"),
    ]
    assert [e.size for e in listing.entries if e.kind == "file"] == [1, 2]


async def test_list_truncates_at_the_limit(target: Target) -> None:
    for name in "abcde":
        await target.sandbox.write(f"d/{name}", name)
    listing = await target.sandbox.list("d", limit=3)
    assert [e.name for e in listing.entries] == ["a", "b", "c"] and listing.truncated


async def test_list_of_the_root_and_of_an_empty_directory(target: Target) -> None:
    await target.sandbox.write("top.txt", "x")
    await target.sandbox.write("d/f", "x")
    await target.sandbox.delete("d/f")
    names = [e.name for e in (await target.sandbox.list(".")).entries]
    assert names == ["d", "top.txt"]
    assert (await target.sandbox.list("d")).entries == ()


async def test_list_of_a_missing_directory_or_a_file_fails(target: Target) -> None:
    await target.sandbox.write("f.txt", "x")
    assert await code_of(target.sandbox.list("missing")) == "ENOENT"
    assert await code_of(target.sandbox.list("f.txt")) == "ENOTDIR"


async def test_delete_removes_files_and_empty_directories_only(target: Target) -> None:
    await target.sandbox.write("d/f.txt", "x")
    assert await code_of(target.sandbox.delete("d")) == "ENOTEMPTY"
    await target.sandbox.delete("d/f.txt")
    assert not await target.sandbox.exists("d/f.txt")
    await target.sandbox.delete("d")
    assert not await target.sandbox.exists("d")
    assert await code_of(target.sandbox.delete("d")) == "ENOENT"


async def test_expect_sha256_guards_a_write(target: Target) -> None:
    sb = target.sandbox
    await sb.write("new.txt", "first", expect_sha256="absent")
    assert await code_of(sb.write("new.txt", "again", expect_sha256="absent")) == "changed"
    digest = hashlib.sha256(b"first").hexdigest()
    assert (
        await code_of(sb.write("new.txt", "x", expect_sha256=hashlib.sha256(b"other").hexdigest()))
        == "changed"
    )
    await sb.write("new.txt", "second", expect_sha256=digest)
    assert await sb.read("new.txt") == "second"


async def test_a_write_leaves_no_temporary_file_behind(target: Target) -> None:
    for i in range(5):
        await target.sandbox.write("d/f.txt", f"version {i}\n" * 100)
    assert [e.name for e in (await target.sandbox.list("d")).entries] == ["f.txt"]


async def test_a_reader_sees_a_whole_version_never_a_partial_one(target: Target) -> None:
    """Atomic replace: a read during writes gets one complete version."""
    versions = [bytes([65 + i]) * 200_000 for i in range(4)]
    await target.sandbox.write_bytes("big.bin", versions[0])
    seen: list[bytes] = []

    async def writer() -> None:
        for data in versions[1:] * 3:
            await target.sandbox.write_bytes("big.bin", data)

    async def reader() -> None:
        for _ in range(12):
            seen.append(await target.sandbox.read_bytes("big.bin"))

    await asyncio.gather(writer(), reader())
    assert all(data in versions for data in seen)


async def test_a_rewrite_keeps_the_files_mode(target: Target) -> None:
    target.require(Capability.COMMANDS)  # the API has no chmod: a command sets the mode
    await target.sandbox.write("run.sh", "#!/bin/sh\n")
    await sh(target, "chmod 750 run.sh")
    await target.sandbox.write("run.sh", "#!/bin/sh\necho hi\n")
    assert (await target.sandbox.stat("run.sh")).mode & 0o777 == 0o750


async def test_text_that_cannot_be_utf8_is_decode_and_nothing_is_written(target: Target) -> None:
    lone_surrogate = "bad \udcff byte"
    assert await code_of(target.sandbox.write("w.txt", lone_surrogate)) == "decode"
    assert await code_of(target.sandbox.append("w.txt", lone_surrogate)) == "decode"
    assert not await target.sandbox.exists("w.txt")
