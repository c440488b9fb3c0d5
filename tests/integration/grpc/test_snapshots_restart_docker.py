"""A snapshot outlives ``kill -9`` of a real ``dispatcher serve`` on Docker: three sessions made
from it after the restart each see the state at the snapshot, and deleting it frees its bytes on
disk."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dispatcher.client import DispatcherClient
from dispatcher.sandbox.tree_size import tree_bytes
from tests.integration.grpc.test_restart_docker import serve  # noqa: F401 (the fixture)
from tests.server.helpers import text_of
from tests.server.persistence.test_restart import kill9
from tests.server.serve_process import ServeProcess

pytestmark = pytest.mark.docker


def sh(client: DispatcherClient, sid: str, command: str) -> str:
    result = client.call(sid, "shell", {"command": command})
    assert not result.is_error, text_of(result)
    return text_of(result)


def test_snapshot_of_a_paused_session_survives_kill_9(
    serve: Callable[..., ServeProcess],  # noqa: F811
) -> None:
    server = serve()
    with server.client() as client:
        sid = client.create_session("proj").session_id
        sh(
            client,
            sid,
            'echo at-snapshot > state.txt && mkdir -p "$HOME/.cache" && echo home > "$HOME/.cache/c"',
        )
        client.pause_session(sid)
        snap = client.snapshot_session(sid, "paused")
        client.resume_session(sid)
        sh(client, sid, "echo later > state.txt")
    kill9(server)
    server = serve()
    root = server.home / "snapshots"
    with server.client() as client:
        assert [s.snapshot_id for s in client.list_snapshots()] == [snap.snapshot_id]
        for _ in range(3):
            child = client.create_session(snapshot_id=snap.snapshot_id).session_id
            seen = sh(client, child, 'cat state.txt "$HOME/.cache/c"')
            assert seen.split() == ["at-snapshot", "home"]
            sh(client, child, "echo mine > state.txt")  # the next child still sees the snapshot
        before = tree_bytes(str(root))
        assert before >= snap.size_bytes > 0
        assert client.delete_snapshot(snap.snapshot_id) == snap.size_bytes
        assert tree_bytes(str(root)) <= before - snap.size_bytes
        assert client.list_snapshots() == []
