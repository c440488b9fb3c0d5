"""The snapshot and fork RPCs' refusals through the real server (the local backend copies no
sandbox): FAILED_PRECONDITION saying so, bad requests named, and an interrupted copy removed at
start."""

from __future__ import annotations

import pytest

from dispatcher.client import RequestFailed
from tests.server.conftest import Harness, ServerFactory


async def test_local_backend_refuses_snapshots_and_forks(harness: Harness) -> None:
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    with pytest.raises(RequestFailed) as snap:
        await client.snapshot_session(sid)
    assert snap.value.code == "FAILED_PRECONDITION" and "cannot snapshot" in snap.value.details
    with pytest.raises(RequestFailed) as fork:
        await client.fork_session(sid, 2)
    assert fork.value.code == "FAILED_PRECONDITION"
    assert [s.session_id for s in await client.list_sessions()] == [sid]  # no child left behind
    assert not list((harness.tmp / "home" / "snapshots" / "alpha").iterdir())  # nor a partial copy


async def test_bad_requests_are_named(harness: Harness) -> None:
    client = harness.client()
    sid = (await client.create_session("w")).session_id
    for count in (0, 101):
        with pytest.raises(RequestFailed) as bad:
            await client.fork_session(sid, count)
        assert bad.value.code == "INVALID_ARGUMENT" and "count: from 1 to 100" in bad.value.details
    with pytest.raises(RequestFailed) as no_source:
        await client.fork_session("", 1)
    assert no_source.value.code == "INVALID_ARGUMENT" and "exactly one source" in no_source.value.details
    with pytest.raises(RequestFailed) as long_name:
        await client.snapshot_session(sid, "n" * 129)
    assert long_name.value.code == "INVALID_ARGUMENT" and "at most 128" in long_name.value.details
    for call in (client.delete_snapshot("snap_nope"), client.create_session(snapshot_id="snap_nope")):
        with pytest.raises(RequestFailed) as unknown:
            await call
        assert unknown.value.code == "NOT_FOUND"


async def test_an_interrupted_copy_is_removed_at_start(make_server: ServerFactory) -> None:
    first = await make_server()
    left = first.tmp / "home" / "snapshots" / "alpha" / "snap_killed_mid_copy"
    await first.server.stop(grace=0)
    (left / "workspace").mkdir(parents=True)
    (left / "workspace" / "half").write_text("x")
    await make_server()
    assert not left.exists()
