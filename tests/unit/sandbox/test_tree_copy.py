"""Copying a tree a sandbox wrote (``tree_copy.py``, a snapshot's workspace and /tmp): contents,
modes and links kept, no link the sandbox left ever followed on either side, and every entry and
byte charged to the copy's budget before it is written, so a tree past it stops there."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import threading
from pathlib import Path

import pytest

from dispatcher.core.provider_api import BLOCK, CopyBudget, CopyBudgetExceeded
from dispatcher.sandbox import tree_copy
from dispatcher.sandbox.tree_copy import TreeTooDeep, copy_tree, run_copy

MiB = 1 << 20


def unbounded() -> CopyBudget:
    return CopyBudget(sys.maxsize, sys.maxsize)


def file_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def test_contents_modes_and_links_are_copied(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "home" / "venv" / "bin").mkdir(parents=True)
    (src / "home" / "venv" / "bin" / "python").write_text("#!/bin/sh\n")
    os.chmod(src / "home" / "venv" / "bin" / "python", 0o755)
    (src / "home" / ".secret").write_text("s")
    os.chmod(src / "home" / ".secret", 0o600)
    os.symlink("venv/bin/python", src / "home" / "py")
    os.mkfifo(src / "fifo")  # skipped: a pipe has no contents to keep
    (src / "setuid").write_text("")
    os.chmod(src / "setuid", 0o4755)
    dst.mkdir()
    copied = copy_tree(str(src), str(dst), unbounded())
    assert copied == len("#!/bin/sh\n") + 1
    assert (dst / "home" / "venv" / "bin" / "python").read_text() == "#!/bin/sh\n"
    assert os.stat(dst / "home" / "venv" / "bin" / "python").st_mode & 0o777 == 0o755
    assert os.stat(dst / "home" / ".secret").st_mode & 0o777 == 0o600
    assert os.readlink(dst / "home" / "py") == "venv/bin/python"
    assert not (dst / "fifo").exists()
    assert os.stat(dst / "setuid").st_mode & 0o7777 == 0o755  # no set-id bit copied


def test_the_root_and_hard_links_are_kept_as_cp_a_keeps_them(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "a").mkdir(parents=True)
    (src / "a" / "one").write_bytes(b"x" * 10_000)
    os.link(src / "a" / "one", src / "two")
    os.chmod(src, 0o751)
    os.utime(src, ns=(1_000_000_000, 2_000_000_000))
    budget = unbounded()
    copy_tree(str(src), str(dst), budget, keep_root=True)
    assert os.stat(dst).st_mode & 0o777 == 0o751 and os.stat(dst).st_mtime_ns == 2_000_000_000
    assert os.stat(dst / "two").st_ino == os.stat(dst / "a" / "one").st_ino  # one inode, as du counts
    assert (dst / "two").read_bytes() == b"x" * 10_000
    # Counted as du counts it: the directory a block, the file's bytes once, rounded up to blocks.
    assert budget.copied_bytes == BLOCK + 3 * BLOCK and budget.copied_entries == 3


def test_a_link_out_of_the_tree_is_copied_as_a_link_never_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host-secret").write_text("do not copy")
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    os.symlink(str(outside), src / "dir-link")
    os.symlink(str(outside / "host-secret"), src / "file-link")
    copy_tree(str(src), str(dst), unbounded())
    assert os.readlink(dst / "dir-link") == str(outside)
    assert sorted(p.name for p in dst.iterdir()) == ["dir-link", "file-link"]
    assert list(outside.iterdir()) == [outside / "host-secret"]  # nothing written through a link


def test_a_link_in_the_destination_is_not_written_through(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("unchanged")
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "f").write_text("new")
    os.symlink(str(target), dst / "f")  # planted where the copy writes
    with pytest.raises(OSError):
        copy_tree(str(src), str(dst), unbounded())
    assert target.read_text() == "unchanged"


def test_entries_are_bounded(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    for i in range(20):
        (src / f"f{i:02}").write_text("")
    with pytest.raises(CopyBudgetExceeded) as past:
        copy_tree(str(src), str(dst), CopyBudget(sys.maxsize, 10), label="workspace")
    assert past.value.unit == "entries" and past.value.copied_entries == 10
    assert past.value.where.startswith("workspace/f")
    assert len(list(dst.iterdir())) == 10  # stopped at the bound, not after the tree


def test_bytes_stop_the_copy_at_the_budget_not_after_the_tree(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    for i in range(10):
        (src / f"f{i}").write_bytes(b"\0" * MiB)
    budget = CopyBudget(3 * MiB + MiB // 2, sys.maxsize)
    with pytest.raises(CopyBudgetExceeded) as past:
        copy_tree(str(src), str(dst), budget)
    assert past.value.unit == "bytes" and past.value.copied_bytes == 3 * MiB
    assert "after 3,145,728 bytes in 4 entries" in str(past.value)
    # Three files whole, the fourth cut at what was left and one byte more, the rest never opened.
    assert file_bytes(dst) == 3 * MiB + MiB // 2 + 1
    assert len(list(dst.iterdir())) == 4


def test_a_file_larger_than_the_budget_is_read_to_the_budget_and_one_byte(tmp_path: Path) -> None:
    # The copy never trusts the size the listing gave: a file that grows while it is copied is
    # read as far as the budget allows and one byte more, which is what a larger file shows.
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "small").write_bytes(b"s" * 100)
    (src / "grows").write_bytes(os.urandom(5 * MiB))
    budget = CopyBudget(2 * MiB, sys.maxsize)
    with pytest.raises(CopyBudgetExceeded) as past:
        copy_tree(str(src), str(dst), budget, label="tmp")
    assert past.value.where == "tmp/grows" and past.value.unit == "bytes"
    small = BLOCK if (dst / "small").exists() else 0  # listing order decides which came first
    assert (dst / "grows").stat().st_size == 2 * MiB - small + 1


def test_one_budget_spans_the_tmp_and_the_workspace_copies(tmp_path: Path) -> None:
    tmp, ws = tmp_path / "tmp", tmp_path / "ws"
    for d in (tmp, ws, tmp_path / "snap"):
        d.mkdir()
    (tmp / "cache").write_bytes(b"c" * (2 * MiB))
    (ws / "data").write_bytes(b"d" * (2 * MiB))
    budget = CopyBudget(3 * MiB, sys.maxsize)
    copy_tree(str(tmp), str(tmp_path / "snap" / "tmp"), budget, label="tmp")
    with pytest.raises(CopyBudgetExceeded) as past:
        copy_tree(str(ws), str(tmp_path / "snap" / "workspace"), budget, label="workspace")
    assert past.value.where == "workspace/data" and past.value.copied_bytes == 2 * MiB


def test_a_stopped_budget_ends_the_copy_at_its_next_entry(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_text("x")
    budget = unbounded()
    budget.stop()
    with pytest.raises(CopyBudgetExceeded) as stopped:
        copy_tree(str(src), str(tmp_path / "dst"), budget)
    assert stopped.value.unit == "stopped" and not list((tmp_path / "dst").iterdir())


def test_nesting_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tree_copy, "MAX_DEPTH", 5)
    deep = tmp_path / "src"
    (deep / "1" / "2" / "3" / "4" / "5" / "6").mkdir(parents=True)
    with pytest.raises(TreeTooDeep, match="workspace/1/2/3/4/5: directories nested deeper than 5"):
        copy_tree(str(deep), str(tmp_path / "dst"), unbounded(), label="workspace")


def test_a_copy_across_filesystems_falls_back_to_read_and_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def cross_device(src: int, dst: int, count: int) -> int:
        raise OSError(18, "Invalid cross-device link")  # EXDEV: a tmpfs to the server's disk

    monkeypatch.setattr(os, "copy_file_range", cross_device)
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(3 * MiB + 7)
    (src / "f").write_bytes(data)
    with pytest.raises(CopyBudgetExceeded):
        copy_tree(str(src), str(tmp_path / "small"), CopyBudget(MiB, sys.maxsize))
    assert (tmp_path / "small" / "f").stat().st_size == MiB + 1  # bounded the same way
    copy_tree(str(src), str(tmp_path / "dst"), unbounded())
    assert (tmp_path / "dst" / "f").read_bytes() == data


class GatedBudget(CopyBudget):
    """Holds the copy at its third entry until the budget is stopped."""

    def __init__(self) -> None:
        super().__init__(sys.maxsize, sys.maxsize)
        self.held = threading.Event()
        self.gate = threading.Event()

    def entry(self, where: str, nbytes: int = 0) -> None:
        if self.copied_entries == 2:
            self.held.set()
            self.gate.wait()
        super().entry(where, nbytes)

    def stop(self) -> None:
        super().stop()
        self.gate.set()


async def test_a_cancelled_copy_has_ended_before_the_cancellation_goes_on(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    for i in range(10):
        (src / f"f{i}").write_text("x")
    budget = GatedBudget()
    ended = threading.Event()

    def copy() -> int:
        try:
            return copy_tree(str(src), str(dst), budget)
        finally:
            ended.set()

    copying = asyncio.ensure_future(run_copy(budget, copy))
    await asyncio.to_thread(budget.held.wait, 30)
    copying.cancel()
    with pytest.raises(asyncio.CancelledError):
        await copying
    # The thread was told to stop and waited for: nothing more is written once the caller
    # goes on to remove the copy.
    assert ended.is_set() and len(list(dst.iterdir())) == 2


async def test_run_copy_returns_what_the_copy_returns(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"abc")
    budget = unbounded()
    copy = functools.partial(copy_tree, str(tmp_path / "src"), str(tmp_path / "dst"), budget)
    assert await run_copy(budget, copy) == 3


def test_a_stopped_budget_ends_a_large_file_at_its_next_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tree_copy, "CHUNK", 4096)

    class StopsAfterTwoChunks(CopyBudget):
        def charge(self, where: str, nbytes: int) -> None:
            super().charge(where, nbytes)
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls == 3:  # the file's entry, then its first two chunks
                self.stop()  # as a cancelled caller does, from another thread

    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(b"b" * (100 * 4096))
    with pytest.raises(CopyBudgetExceeded) as stopped:
        copy_tree(str(src), str(tmp_path / "dst"), StopsAfterTwoChunks(sys.maxsize, sys.maxsize))
    assert stopped.value.unit == "stopped" and stopped.value.where == "big"
    assert (tmp_path / "dst" / "big").stat().st_size == 2 * 4096
