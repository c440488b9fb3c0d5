"""Copying a /tmp between trees (``tmp_copy.py``): contents, modes and links kept, and no link a
sandbox left is ever followed, on either side."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.sandbox.docker import tmp_copy
from dispatcher.sandbox.docker.tmp_copy import TmpCopyError


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
    copied = tmp_copy._copy_between(str(src), str(dst))
    assert copied == len("#!/bin/sh\n") + 1
    assert (dst / "home" / "venv" / "bin" / "python").read_text() == "#!/bin/sh\n"
    assert os.stat(dst / "home" / "venv" / "bin" / "python").st_mode & 0o777 == 0o755
    assert os.stat(dst / "home" / ".secret").st_mode & 0o777 == 0o600
    assert os.readlink(dst / "home" / "py") == "venv/bin/python"
    assert not (dst / "fifo").exists()
    assert os.stat(dst / "setuid").st_mode & 0o7777 == 0o755  # no set-id bit copied


def test_a_link_out_of_the_tree_is_copied_as_a_link_never_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host-secret").write_text("do not copy")
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    os.symlink(str(outside), src / "dir-link")
    os.symlink(str(outside / "host-secret"), src / "file-link")
    tmp_copy._copy_between(str(src), str(dst))
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
        tmp_copy._copy_between(str(src), str(dst))
    assert target.read_text() == "unchanged"


def test_entries_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    for i in range(20):
        (src / f"f{i}").write_text("")
    monkeypatch.setattr(tmp_copy, "MAX_ENTRIES", 10)
    with pytest.raises(TmpCopyError, match="more than 10 entries"):
        tmp_copy._copy_between(str(src), str(dst))
