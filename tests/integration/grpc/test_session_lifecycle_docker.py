"""Session clocks on the Docker backend: idle expiry removes the container, a background job is
activity, pause freezes the container (CPU 0) and resume finds /tmp and the job intact, and
``docker rm`` of a paused container is handled like any vanished one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import docker
import pytest

from dispatcher.client import AsyncDispatcherClient
from dispatcher.sandbox.container.labels import LABEL_SESSION
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.events import SessionExpired
from tests.integration.grpc.conftest import Start
from tests.server.helpers import next_event, text_of, until

pytestmark = pytest.mark.docker


async def _rpc(client: AsyncDispatcherClient, name: str, request: Any) -> Any:
    return await getattr(client._stub, name)(request, metadata=client._metadata, timeout=60)


def _containers(dc: docker.DockerClient, session_id: str) -> list[Any]:
    return list(
        dc.containers.list(all=True, filters={"label": f"{LABEL_SESSION}={session_id}"}, ignore_removed=True)
    )


async def test_an_idle_session_is_closed_and_its_container_removed(
    start: Start, docker_client: docker.DockerClient
) -> None:
    h = await start(sessions={"idle_timeout_seconds": 2, "expiring_notice_seconds": 0})
    client = h.client()
    sid = (await _rpc(client, "CreateSession", pb.CreateSessionRequest())).session.session_id
    result = await client.call(sid, "shell", {"command": "echo up"})
    assert "up" in text_of(result)
    assert _containers(docker_client, sid)
    expired = await next_event(client, sid, SessionExpired, timeout=30)
    assert expired.payload.reason == "idle"
    await until(lambda: not _containers(docker_client, sid), timeout=10)


async def test_a_background_job_is_activity_until_it_ends(start: Start) -> None:
    h = await start(sessions={"idle_timeout_seconds": 1, "expiring_notice_seconds": 0})
    client = h.client()
    sid = (await _rpc(client, "CreateSession", pb.CreateSessionRequest())).session.session_id
    result = await client.call(sid, "shell", {"command": "sleep 4 >/dev/null 2>&1 &"})
    assert not result.is_error, text_of(result)
    job_started = time.monotonic()
    await next_event(client, sid, SessionExpired, timeout=30)
    assert time.monotonic() - job_started >= 4


async def test_pause_freezes_and_resume_keeps_tmp_and_processes(
    start: Start, docker_client: docker.DockerClient
) -> None:
    h = await start()
    client = h.client()
    sid = (await _rpc(client, "CreateSession", pb.CreateSessionRequest())).session.session_id
    setup = "echo kept > /tmp/mark; (while :; do :; done) >/dev/null 2>&1 & echo $! > /tmp/pid; echo started"
    assert "started" in text_of(await client.call(sid, "shell", {"command": setup}))
    await _rpc(client, "PauseSession", pb.PauseSessionRequest(session_id=sid))
    (container,) = _containers(docker_client, sid)
    container.reload()
    assert container.status == "paused"
    first = docker_client.api.stats(container.id, stream=False)
    second = docker_client.api.stats(container.id, stream=False)
    used = second["cpu_stats"]["cpu_usage"]["total_usage"] - first["cpu_stats"]["cpu_usage"]["total_usage"]
    assert used == 0  # a busy loop, frozen
    result = await client.call(
        sid, "shell", {"command": "cat /tmp/mark; kill -0 $(cat /tmp/pid) && echo alive"}
    )
    text = text_of(result)
    assert "was paused and has been resumed" in text.splitlines()[0]
    assert "kept" in text and "alive" in text
    container.reload()
    assert container.status == "running"


async def test_a_paused_container_removed_behind_the_servers_back_is_recreated(
    start: Start, docker_client: docker.DockerClient
) -> None:
    h = await start()
    client = h.client()
    sid = (await _rpc(client, "CreateSession", pb.CreateSessionRequest())).session.session_id
    await client.call(sid, "shell", {"command": "true"})
    await _rpc(client, "PauseSession", pb.PauseSessionRequest(session_id=sid))
    (container,) = _containers(docker_client, sid)
    container.remove(force=True)
    result = await client.call(sid, "shell", {"command": "echo fresh"})
    text = text_of(result)
    assert "fresh" in text and "recreated" in text and not result.is_error


async def test_staged_changes_on_a_paused_session_resume_it_and_keep_tmp_and_processes(
    start: Start, docker_client: docker.DockerClient
) -> None:
    """Issue 37 item 7: ApplyStagedChanges on a paused session waited on the frozen agent, refused
    the change and had the container recreated (its /tmp and processes gone); it resumes first,
    as Dispatch and the transfers do."""
    h = await start()
    client = h.client()
    session = await client.create_session(mode="review")
    sid = session.session_id
    setup = "echo kept > /tmp/mark; sleep 600 >/dev/null 2>&1 & echo $! > /tmp/pid; echo started"
    assert "started" in text_of(await client.call(sid, "shell", {"command": setup}))
    staged = []
    for path in ("a.txt", "b.txt"):
        written = await client.call(sid, "write_file", {"path": path, "content": "new\n"})
        assert not written.is_error, text_of(written)
        staged.append(written.metadata["staged"])
    await _rpc(client, "PauseSession", pb.PauseSessionRequest(session_id=sid))
    (container,) = _containers(docker_client, sid)

    discard = pb.DiscardStagedChangesRequest(session_id=sid, ids=[staged[1]])
    assert list((await _rpc(client, "DiscardStagedChanges", discard)).discarded_ids) == [staged[1]]
    container.reload()
    assert container.status == "paused"  # a discard reaches no sandbox: nothing to resume for
    apply = pb.ApplyStagedChangesRequest(session_id=sid, ids=[staged[0]])
    applied = await _rpc(client, "ApplyStagedChanges", apply)
    assert list(applied.applied_ids) == [staged[0]] and not applied.refused, applied
    workspace = Path(session.workspace_path)
    assert (workspace / "a.txt").read_text() == "new\n" and not (workspace / "b.txt").exists()

    assert [c.id for c in _containers(docker_client, sid)] == [container.id]  # not recreated
    container.reload()
    assert container.status == "running"
    text = text_of(
        await client.call(sid, "shell", {"command": "cat /tmp/mark; kill -0 $(cat /tmp/pid) && echo alive"})
    )
    assert "kept" in text and "alive" in text
