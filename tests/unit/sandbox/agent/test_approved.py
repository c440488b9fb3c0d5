"""The agent uses an approved path exactly: walked from the root without following any link.

The race these tests stage: a path is resolved for a confirmation, a human approves it, and
before it is used a process in the sandbox swaps a directory (or the file) for a link elsewhere
in the workspace. Given the approved path, the agent refuses (``changed``) and touches nothing;
given only the path as written, it follows the new link (the behaviour without a confirmation).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.core.sandbox_api import FileOpError
from dispatcher.sandbox.agent.workspace import OpError, Workspace
from dispatcher.sandbox.local import LocalSandbox
from tests.integration.helpers import run


@pytest.fixture
def tree(workspace: Path) -> Path:
    """d/f (approved) and other/f (where a swapped-in link d -> other would lead)."""
    for name in ("d", "other"):
        (workspace / name).mkdir()
    (workspace / "d" / "f").write_text("approved\n")
    (workspace / "other" / "f").write_text("other\n")
    return workspace


def swap_dir(root: Path) -> None:
    """What a sandbox process does between approval and use: d becomes a link to other."""
    os.rename(root / "d", root / "d.old")
    os.symlink("other", root / "d")


def changed(exc: pytest.ExceptionInfo[OpError], done: str) -> bool:
    return exc.value.code == "changed" and f"nothing was {done}" in exc.value.message


def test_resolve_exact_is_what_is_approved_and_keeps_undecodable_names(tree: Path) -> None:
    ws = Workspace(str(tree))
    (tree / "link").symlink_to("other")
    assert ws.resolve_exact("link/f") == "other/f"
    assert ws.resolve_exact("d/../other/new/x") == "other/new/x"
    assert ws.resolve_exact(".") == "."
    os.mkdir(os.path.join(os.fsencode(tree), b"caf\xe9"))
    assert ws.resolve_exact("caf\udce9/n") == "caf\udce9/n"  # not U+FFFD: handed back exactly


def test_a_write_refuses_a_directory_swapped_for_a_link(tree: Path) -> None:
    ws = Workspace(str(tree))
    approved = ws.resolve_exact("d/f")
    swap_dir(tree)
    with pytest.raises(OpError) as caught:
        ws.write("d/f", b"x", approved)
    assert changed(caught, "written")
    assert (tree / "other" / "f").read_text() == "other\n"
    ws.write("d/f", b"unpinned")  # without approval: the path as it is now, as before
    assert (tree / "other" / "f").read_text() == "unpinned"


def test_a_new_file_is_made_only_in_the_approved_directory(tree: Path) -> None:
    ws = Workspace(str(tree))
    approved = ws.resolve_exact("d/new")
    swap_dir(tree)
    with pytest.raises(OpError) as caught:
        ws.write("d/new", b"x", approved)
    assert changed(caught, "written")
    assert not (tree / "other" / "new").exists() and not (tree / "d.old" / "new").exists()


def test_a_file_swapped_for_a_link_is_refused(tree: Path) -> None:
    ws = Workspace(str(tree))
    approved = ws.resolve_exact("d/f")
    os.unlink(tree / "d" / "f")
    os.symlink("../other/f", tree / "d" / "f")
    for op, done in (
        (lambda: ws.write("d/f", b"x", approved), "written"),
        (lambda: ws.read("d/f", 100, True, approved), "read"),
        (lambda: ws.stat("d/f", approved), "read"),
    ):
        with pytest.raises(OpError) as caught:
            op()
        assert changed(caught, done)
    assert (tree / "other" / "f").read_text() == "other\n"
    assert (tree / "d" / "f").is_symlink()


def test_reads_writes_listings_and_stats_refuse_a_swapped_directory(tree: Path) -> None:
    ws = Workspace(str(tree))
    swap_dir(tree)
    for op, done in (
        (lambda: ws.read("d/f", 100, True, "d/f"), "read"),
        (lambda: ws.write("d/f", b"x", "d/f"), "written"),
        (lambda: ws.list("d", 100, "d"), "listed"),
        (lambda: ws.stat("d/f", "d/f"), "read"),
        (lambda: ws.open_cwd("d", "d"), "run"),
    ):
        with pytest.raises(OpError) as caught:
            op()
        assert changed(caught, done)
    assert (tree / "other" / "f").read_text() == "other\n"


def test_approved_paths_work_when_nothing_changed(tree: Path) -> None:
    ws = Workspace(str(tree))
    (tree / "link").symlink_to("other")  # a link at approval time: the approved path is its target
    approved = ws.resolve_exact("link/f")
    ws.write("link/f", b"patched\n", approved)
    assert ws.read("link/f", 100, True, approved) == (b"patched\n", 8)
    ws.write("link/new/deep/g", b"g", ws.resolve_exact("link/new/deep/g"))  # parents are made
    assert (tree / "other" / "new" / "deep" / "g").read_bytes() == b"g"
    assert ws.stat("link/f", approved).path == "other/f"
    names = [e.name for e in ws.list("link", 100, ws.resolve_exact("link"))[0]]
    assert names == ["f", "new"]
    fd, real = ws.open_cwd("link", "other")
    os.close(fd)
    assert real == str(tree.resolve() / "other")
    raw = os.path.join(os.fsencode(tree), b"caf\xe9")
    ws.write("caf\udce9", b"bytes", ws.resolve_exact("caf\udce9"))
    with open(raw, "rb") as fh:
        assert fh.read() == b"bytes"


def test_a_missing_approved_file_is_not_created_by_a_read_or_listing(tree: Path) -> None:
    ws = Workspace(str(tree))
    for op in (
        lambda: ws.read("n/f", 10, True, "n/f"),
        lambda: ws.list("n", 10, "n"),
    ):
        with pytest.raises(FileNotFoundError):
            op()
    assert not (tree / "n").exists()


@pytest.mark.parametrize("approved", ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/", "a\x00b"])
def test_an_approved_path_that_is_not_normalised_and_inside_is_a_bad_request(
    tree: Path, approved: str
) -> None:
    with pytest.raises(OpError) as caught:
        Workspace(str(tree)).read("d/f", 10, True, approved)
    assert caught.value.code == "bad_request"


def test_the_grants_apply_to_the_approved_path(tree: Path) -> None:
    ws = Workspace(str(tree), grants=[("d", "rw"), ("other", "r")])
    with pytest.raises(OpError) as caught:
        ws.write("d/f", b"x", "other/f")
    assert caught.value.code == "denied"
    assert ws.read("d/f", 100, True, "other/f")[0] == b"other\n"


async def test_the_protocol_carries_approved_paths(tree: Path) -> None:
    sb = LocalSandbox(str(tree), kill_wait=1.0)
    try:
        assert await sb.resolve("d/f") == "d/f"
        swap_dir(tree)
        with pytest.raises(FileOpError) as caught:
            await sb.write("d/f", "x", approved="d/f")
        assert caught.value.code == "changed" and "nothing was written" in str(caught.value)
        with pytest.raises(FileOpError, match="changed after it was approved"):
            await run(sb, "touch made", cwd="d", approved_cwd="d")
        assert not (tree / "other" / "made").exists()
        assert (tree / "other" / "f").read_text() == "other\n"
        ran = await run(sb, "pwd -P", cwd="d.old", approved_cwd="d.old")
        assert ran.out.strip().endswith("/d.old")
    finally:
        await sb.aclose()
