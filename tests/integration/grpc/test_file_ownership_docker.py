"""File ownership on the host through the gRPC server (single tenant, Docker backend).

The sandbox runs as the owner of the tenant's workspace root, so a developer's files stay theirs;
as root (a root-owned root) it keeps ``sandbox.user``; a configured ``sandbox.user`` wins; and a
root-owned workspace made by someone else is used as it is, never re-owned.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dispatcher.client import AsyncDispatcherClient
from tests.integration.grpc.single_tenant import Serve, serve_fixture  # noqa: F401  (fixture `serve`)
from tests.server.helpers import text_of

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(os.geteuid() != 0, reason="making workspace roots of other owners needs root"),
]


async def _ids_and_file(client: AsyncDispatcherClient, workspace: str) -> tuple[str, Path]:
    session = await client.create_session(workspace)
    result = await client.call(session.session_id, "shell", {"command": "id -u; id -g; echo hi > made.txt"})
    assert not result.is_error, text_of(result)
    return text_of(result).split()[0] + ":" + text_of(result).split()[1], Path(session.workspace_path)


def _owner(path: Path) -> str:
    st = path.stat()
    return f"{st.st_uid}:{st.st_gid}"


async def test_the_sandbox_runs_as_the_owner_of_the_workspace_root(serve: Serve) -> None:
    client = await serve((4321, 4322))
    ids, workspace = await _ids_and_file(client, "proj/w")
    assert ids == "4321:4322"
    assert _owner(workspace / "made.txt") == "4321:4322"
    assert _owner(workspace) == _owner(workspace.parent) == "4321:4322"  # made for it, never re-owned


async def test_a_root_owned_root_keeps_the_unprivileged_default(serve: Serve) -> None:
    client = await serve((0, 0))
    ids, workspace = await _ids_and_file(client, "w")
    assert ids == "1000:1000"
    assert _owner(workspace) == _owner(workspace / "made.txt") == "1000:1000"
    assert _owner(workspace.parent) == "0:0"


async def test_a_configured_sandbox_user_wins(serve: Serve) -> None:
    client = await serve((4321, 4321), user="2345:2346")
    ids, workspace = await _ids_and_file(client, "w")
    assert ids == "2345:2346"
    assert _owner(workspace / "made.txt") == "2345:2346"


async def test_a_root_owned_workspace_is_never_reowned(serve: Serve, tmp_path: Path) -> None:
    old = tmp_path / "home" / "workspaces" / "old"
    old.mkdir(parents=True)
    (old / "keep.txt").write_text("root's\n")
    client = await serve((0, 0))
    session = await client.create_session("old")
    listed = await client.call(session.session_id, "shell", {"command": "cat keep.txt"})
    assert not listed.is_error and "root's" in text_of(listed)
    wrote = await client.call(session.session_id, "shell", {"command": "echo x > new.txt"})
    assert wrote.is_error and "Permission denied" in text_of(wrote)
    assert _owner(old) == _owner(old / "keep.txt") == "0:0"
    assert not (old / "new.txt").exists()


async def test_a_root_owned_file_placed_on_the_host_says_whose_it_is_and_how_to_fix_it(serve: Serve) -> None:
    """Issue 22 item 8: not a bare "Permission denied", but whose the file is and the chown."""
    client = await serve((0, 0))  # the sandbox runs as 1000:1000
    session = await client.create_session("placed")
    workspace = Path(session.workspace_path)
    (workspace / "root-dir").mkdir()  # made on the host, as root
    (workspace / "secret.txt").write_text("root's")
    (workspace / "secret.txt").chmod(0o600)
    wrote = await client.call(session.session_id, "write_file", {"path": "root-dir/x.txt", "content": "x"})
    read = await client.call(session.session_id, "read_file", {"path": "secret.txt"})
    for result, what in ((wrote, "its directory"), (read, "the file")):
        assert result.is_error, text_of(result)
        text = text_of(result)
        assert "Permission denied" in text and f"{what} belongs to uid 0" in text, text
        assert "not to the sandbox user, uid 1000" in text and "chown 1000:1000" in text, text
