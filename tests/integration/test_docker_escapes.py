"""Escapes from /workspace are refused inside the container, where the symlinks are resolved."""

from __future__ import annotations

import os

import pytest

from dispatcher.core.errors import WorkspaceEscapeError
from dispatcher.core.sandbox_api import Sandbox
from dispatcher.core.sessions.session import Session
from tests.integration.helpers import run

pytestmark = pytest.mark.docker


@pytest.fixture
async def links(sandbox: Sandbox) -> Sandbox:
    """Symlinks planted from inside the sandbox, as a hostile command would."""
    ran = await run(
        sandbox,
        "ln -s /etc etc_link && ln -s /tmp tmp_link && ln -s ../.. up_link"
        " && ln -s /proc/self/root root_link && echo secret > /tmp/secret && mkdir -p real",
    )
    assert ran.result.exit_code == 0, ran.err
    return sandbox


@pytest.mark.parametrize(
    "path",
    [
        "../etc/passwd",
        "a/../../etc/passwd",
        "/etc/passwd",
        "/workspace/../etc/passwd",
        "/proc/self/root/etc/passwd",
        "etc_link/passwd",
        "tmp_link/secret",
        "up_link/etc/passwd",
        "root_link/etc/passwd",
    ],
)
async def test_reads_that_escape_are_refused(links: Sandbox, path: str) -> None:
    with pytest.raises(WorkspaceEscapeError):
        await links.read_bytes(path)


@pytest.mark.parametrize("path", ["tmp_link/new.txt", "etc_link/new.conf", "root_link/tmp/new", "../new"])
async def test_writes_through_a_symlinked_parent_are_refused(links: Sandbox, path: str) -> None:
    with pytest.raises(WorkspaceEscapeError):
        await links.write(path, "pwned")
    ran = await run(links, "ls /tmp")
    assert "new" not in ran.out.split()


async def test_other_operations_refuse_escapes(links: Sandbox) -> None:
    for op in (
        lambda: links.list("etc_link"),
        lambda: links.stat("/etc/passwd"),
        lambda: links.exists("tmp_link/secret"),
        lambda: links.append("etc_link/x", "x"),
        lambda: links.delete("tmp_link/secret"),
    ):
        with pytest.raises(WorkspaceEscapeError):
            await op()
    assert (await run(links, "cat /tmp/secret")).out == "secret\n"


async def test_symlinks_inside_the_workspace_still_work(links: Sandbox, session: Session) -> None:
    await links.write("real/file.txt", "inside")
    os.symlink("real/file.txt", os.path.join(session.workspace_path, "inner_link"))
    assert await links.read("inner_link") == "inside"
    listing = await links.list(".")
    kinds = {entry.name: entry.kind for entry in listing.entries}
    assert kinds["etc_link"] == "symlink" and kinds["real"] == "dir"


async def test_exec_cwd_outside_the_workspace_is_refused(sandbox: Sandbox) -> None:
    with pytest.raises(WorkspaceEscapeError):
        await run(sandbox, "pwd", cwd="../")
