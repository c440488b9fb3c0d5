"""read_file through the local agent: paging, caps, binary refusal, images, escapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.core.errors import ToolCancelled, ToolExecutionError, WorkspaceEscapeError
from dispatcher.core.sandbox_api import FileOpError
from dispatcher.core.types import ImageBlock
from dispatcher.tools.read_file import CONTENT_CAP, READ_CAP, ReadFileTool
from tests.unit.tools.conftest import Harness, text_of

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + bytes(range(40))


def numbered(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


async def test_reads_whole_small_file(harness: Harness, workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo\n")
    output = await harness.run(ReadFileTool(), path="a.txt")
    assert text_of(output) == "one\ntwo\n"
    assert output.metadata["lines"] == 2 and not output.metadata["truncated"]


async def test_missing_trailing_newline_is_preserved(harness: Harness, workspace: Path) -> None:
    (workspace / "a.txt").write_text("one\ntwo")
    assert text_of(await harness.run(ReadFileTool(), path="a.txt")) == "one\ntwo"


async def test_offset_and_limit_select_lines(harness: Harness, workspace: Path) -> None:
    (workspace / "a.txt").write_text(numbered(10))
    text = text_of(await harness.run(ReadFileTool(), path="a.txt", offset=3, limit=2))
    assert text.startswith("line 3\nline 4\n[")
    assert "lines 3-4 of 10" in text and "offset=5" in text
    tail = text_of(await harness.run(ReadFileTool(), path="a.txt", offset=9))
    assert tail == "line 9\nline 10\n"


async def test_offset_past_end_is_an_error(harness: Harness, workspace: Path) -> None:
    (workspace / "a.txt").write_text(numbered(3))
    with pytest.raises(ToolExecutionError, match="past the end"):
        await harness.run(ReadFileTool(), path="a.txt", offset=4)


async def test_empty_file(harness: Harness, workspace: Path) -> None:
    (workspace / "e.txt").write_text("")
    assert text_of(await harness.run(ReadFileTool(), path="e.txt")) == "[empty file]"


async def test_content_cap_cuts_at_a_line_with_a_marker(harness: Harness, workspace: Path) -> None:
    (workspace / "long.txt").write_text(numbered(5000))
    text = text_of(await harness.run(ReadFileTool(), path="long.txt"))
    body, _, marker = text.rpartition("\n[")
    assert len(body) <= CONTENT_CAP and body.endswith(tuple(f"line {i}" for i in range(1, 5001)))
    last = int(body.rsplit(" ", 1)[1])
    assert f"use offset={last + 1}" in marker and "of 5000" in marker


async def test_one_enormous_line_shows_its_start(harness: Harness, workspace: Path) -> None:
    (workspace / "min.js").write_text("x" * 100_000)
    text = text_of(await harness.run(ReadFileTool(), path="min.js"))
    assert len(text) < CONTENT_CAP + 100 and "line cut" in text


async def test_file_larger_than_read_cap_says_so(harness: Harness, workspace: Path) -> None:
    (workspace / "huge.log").write_text(numbered(60_000))  # ~650 KiB
    text = text_of(await harness.run(ReadFileTool(), path="huge.log", offset=100, limit=2))
    assert text.startswith("line 100\nline 101\n")
    assert f"larger than {READ_CAP // 1024} KiB" in text
    with pytest.raises(ToolExecutionError, match="shell"):
        await harness.run(ReadFileTool(), path="huge.log", offset=59_000)


async def test_binary_file_is_refused_clearly(harness: Harness, workspace: Path) -> None:
    (workspace / "prog.bin").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(100))
    with pytest.raises(FileOpError) as info:
        await harness.run(ReadFileTool(), path="prog.bin")
    assert info.value.code == "binary" and "binary" in info.value.message


@pytest.mark.parametrize(
    ("data", "media_type"),
    [
        (PNG, "image/png"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(50), "image/jpeg"),
        (b"GIF89a" + bytes(50), "image/gif"),
        (b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(50), "image/webp"),
    ],
)
async def test_images_come_back_as_image_blocks(
    harness: Harness, workspace: Path, data: bytes, media_type: str
) -> None:
    (workspace / "pic").write_bytes(data)
    output = await harness.run(ReadFileTool(), path="pic")
    assert output.content == [ImageBlock(data=data, media_type=media_type)]


async def test_image_bigger_than_text_cap_is_read_whole(harness: Harness, workspace: Path) -> None:
    data = PNG + bytes(READ_CAP * 2)
    (workspace / "big.png").write_bytes(data)
    (block,) = (await harness.run(ReadFileTool(), path="big.png")).content
    assert isinstance(block, ImageBlock) and block.data == data


async def test_missing_file_and_directory_errors(harness: Harness, workspace: Path) -> None:
    (workspace / "d").mkdir()
    with pytest.raises(FileOpError) as info:
        await harness.run(ReadFileTool(), path="nope.txt")
    assert info.value.code == "ENOENT" and "nope.txt" in info.value.message
    with pytest.raises(FileOpError) as info:
        await harness.run(ReadFileTool(), path="d")
    assert info.value.code == "EISDIR" and "list_dir" in info.value.message


@pytest.mark.parametrize(
    "path",
    [
        "../outside/secret.txt",
        "/etc/passwd",
        "link_out/secret.txt",
        "etc_link/passwd",
        "/proc/self/root/etc/passwd",
    ],
)
async def test_escapes_are_permission_denied(
    harness: Harness, workspace: Path, outside: Path, path: str
) -> None:
    (workspace / "link_out").symlink_to(outside)
    (workspace / "etc_link").symlink_to("/etc")
    with pytest.raises(WorkspaceEscapeError):
        await harness.run(ReadFileTool(), path=path)


async def test_cancelled_before_start(harness: Harness, workspace: Path) -> None:
    (workspace / "a.txt").write_text("x")
    harness.cancel_event.set()
    with pytest.raises(ToolCancelled):
        await harness.run(ReadFileTool(), path="a.txt")
    assert await ReadFileTool().cancel() is False
