"""The agent never recurses on input: deep paths and long link chains get plain errors (issue 7, point 11)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from dispatcher.core.sandbox_api import ExecRequest, FileOpError
from dispatcher.sandbox.agent.workspace import MAX_DEPTH, MAX_SYMLINKS, OpError, Workspace, realpath
from dispatcher.sandbox.local import LocalSandbox


async def test_a_1500_level_write_is_a_plain_error_and_the_agent_lives_on(
    sandbox: LocalSandbox, workspace: Path
) -> None:
    await sandbox.write("before.txt", "x")
    pid = sandbox.pid
    with pytest.raises(FileOpError) as info:
        await sandbox.write("/".join(["a"] * 1500) + "/f.txt", "deep")
    assert info.value.code == "ENAMETOOLONG"
    assert "1500 directories deep" in str(info.value)
    assert not (workspace / "a").exists()  # refused before anything was made
    assert sandbox.pid == pid  # same agent, still answering
    assert await sandbox.read("before.txt") == "x"


async def test_a_write_deeper_than_the_recursion_limit_but_within_bounds_succeeds(
    sandbox: LocalSandbox, workspace: Path
) -> None:
    depth = 1010  # os.makedirs recursed once per missing level: RecursionError past ~1000
    assert depth <= MAX_DEPTH
    path = "/".join(["d"] * depth) + "/f.txt"
    try:
        await sandbox.write(path, "deep")
        assert (workspace / path).read_text() == "deep"
        await sandbox.append(path, "er")
        assert await sandbox.read(path) == "deeper"
    finally:
        _remove_chain(workspace / "d")


def _remove_chain(top: Path) -> None:
    """Remove a deep chain of directories bottom-up (shutil.rmtree, and pytest's cleanup, recurse)."""
    chain = [top]
    while (chain[-1] / "d").is_dir():
        chain.append(chain[-1] / "d")
    for directory in reversed(chain):
        for child in directory.iterdir():
            if not child.is_dir():
                child.unlink()
        directory.rmdir()


async def test_a_deep_write_does_not_disturb_a_running_command(sandbox: LocalSandbox) -> None:
    out = bytearray()
    running = asyncio.ensure_future(
        sandbox.exec(
            ExecRequest("while [ ! -e go ]; do sleep 0.02; done; echo alive", timeout=10.0),
            lambda _stream, data: out.extend(data),
            asyncio.Event(),
        )
    )
    with pytest.raises(FileOpError):
        await sandbox.write("/".join(["a"] * 1500) + "/f", "x")
    assert not running.done()
    await sandbox.write("go", "")
    result = await asyncio.wait_for(running, 10)
    assert result.exit_code == 0 and bytes(out) == b"alive\n"


async def test_a_long_chain_of_links_is_eloop_not_a_crash(sandbox: LocalSandbox, workspace: Path) -> None:
    (workspace / "end").write_text("found")
    chain = 1200  # os.path.realpath recursed once per nested link
    for i in range(chain):
        os.symlink(f"l{i + 1}" if i + 1 < chain else "end", workspace / f"l{i}")
    with pytest.raises(FileOpError) as info:
        await sandbox.read("l0")
    assert info.value.code == "ELOOP"
    assert await sandbox.read(f"l{chain - MAX_SYMLINKS}") == "found"  # within the kernel's bound


def test_realpath_matches_os_pathrealpath(workspace: Path, outside: Path) -> None:
    (workspace / "d/e").mkdir(parents=True)
    (workspace / "up").symlink_to("..")
    (workspace / "rel").symlink_to("d/e")
    (workspace / "abs").symlink_to(workspace / "d")
    (workspace / "out").symlink_to(outside)
    (workspace / "loop").symlink_to("loop2")
    (workspace / "loop2").symlink_to("loop")
    for rel in ["", ".", "d/e/..", "rel/../..", "abs/e", "up/x", "out/y", "missing/../d", "d//e/./", "/.."]:
        path = str(workspace / rel) if not rel.startswith("/") else rel
        assert realpath(path) == os.path.realpath(path), rel
    with pytest.raises(OpError):
        realpath(str(workspace / "loop"))


def test_directories_are_walked_without_following_a_planted_link(workspace: Path, outside: Path) -> None:
    ws = Workspace(str(workspace))
    (workspace / "sub").symlink_to(outside)
    real_parent = os.path.join(ws.root, "sub")  # as if resolve() had run before the link appeared
    with pytest.raises(OSError):
        ws.make_dirs(real_parent, "sub/f", "rw", "f")
    assert [p.name for p in outside.iterdir()] == ["secret.txt"]
