"""A real ``dispatcher serve`` on Docker, restarted: the same container, /tmp and processes after it.

kill -9 and SIGTERM; a container removed meanwhile; a command running at kill -9; orphans still
reaped; a workspace renamed and replaced while it was down; ``shutdown: {remove_sessions: true}``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from dispatcher.client import DispatcherClient
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolUseBlock
from dispatcher.sandbox.container.config import DEFAULT_IMAGE
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_SESSION, LABEL_TENANT
from dispatcher.sandbox.docker.workspace_volume import loop_backing_file
from tests.events import ToolFailed, event_of
from tests.integration.conftest import ProviderFactory
from tests.integration.grpc.conftest import unmount_under
from tests.integration.helpers import containers_of
from tests.server.helpers import text_of
from tests.server.persistence.test_restart import kill9, sigterm, wait_stored, watch_until
from tests.server.serve_process import ServeProcess, start_serve

pytestmark = pytest.mark.docker

COUNT_SLEEPS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 1000 ' || true"


@pytest.fixture
def serve(tmp_path: Path, make_provider: ProviderFactory) -> Iterator[Callable[..., ServeProcess]]:
    """Start ``dispatcher serve`` on Docker (same home, same instance label each time)."""
    instance = make_provider.new_instance()  # swept by the factory whatever happens
    started: list[ServeProcess] = []

    def go(sandbox: dict[str, Any] | None = None, **shutdown: Any) -> ServeProcess:
        data = {
            "sandbox": {
                "backend": "docker",
                "instance": instance,
                "workspace_quota": "64m",
                **(sandbox or {}),
            },
            "server": {"grace_seconds": 2},
            "log": {"format": "json", "level": "info"},
            "tool_confirmation": {"default": {"EXECUTE": "auto"}},
            "shutdown": shutdown,
        }
        server = start_serve(tmp_path, data=data)
        started.append(server)
        return server

    go.instance = instance  # type: ignore[attr-defined]
    try:
        yield go
    finally:
        for server in started:
            server.close()
        unmount_under(tmp_path)


def shell(client: DispatcherClient, session_id: str, command: str) -> tuple[bool, str]:
    result = client.call(session_id, "shell", {"command": command})
    return result.is_error, text_of(result)


def stored_container(server: ServeProcess, session_id: str) -> str:
    wait_stored(
        server.home,
        "SELECT container_id FROM sessions WHERE session_id = ?",
        (session_id,),
        lambda row: row is not None and row[0],
    )
    import sqlite3

    conn = sqlite3.connect(server.home / "state.db")
    try:
        return str(
            conn.execute("SELECT container_id FROM sessions WHERE session_id = ?", (session_id,)).fetchone()[
                0
            ]
        )
    finally:
        conn.close()


@pytest.mark.parametrize("stop", [kill9, sigterm], ids=["kill-9", "sigterm"])
def test_tmp_and_processes_survive_a_restart(
    serve: Callable[..., ServeProcess],
    docker_client: docker.DockerClient,
    stop: Callable[[ServeProcess], None],
) -> None:
    server = serve()
    with server.client() as client:
        info = client.create_session("proj")
        failed, _ = shell(client, info.session_id, "echo kept > /tmp/keep.txt; sleep 1000 >/dev/null 2>&1 &")
        assert not failed
    container = stored_container(server, info.session_id)
    stop(server)
    server = serve()
    with server.client() as client:
        assert client.get_session(info.session_id).session_id == info.session_id
        assert [s.session_id for s in client.list_sessions()] == [info.session_id]
        failed, out = shell(client, info.session_id, "cat /tmp/keep.txt")
        assert (failed, out.strip()) == (False, "kept"), "".join(server.stderr)[-4000:]
        failed, out = shell(client, info.session_id, COUNT_SLEEPS)
        assert (failed, out.strip()) == (False, "1")  # the background process still runs
    instance = serve.instance  # type: ignore[attr-defined]
    assert [c.id for c in containers_of(docker_client, instance)] == [container]  # re-adopted, not new
    # One loop device over the tenant's quota image, shared by the kept container and the server.
    image = str(server.home / "volumes" / "default.img")
    assert sum(1 for dev in Path("/sys/block").glob("loop*") if loop_backing_file(dev.name) == image) == 1


def test_a_container_removed_meanwhile_gives_a_fresh_sandbox_that_says_so(
    serve: Callable[..., ServeProcess], docker_client: docker.DockerClient
) -> None:
    server = serve()
    with server.client() as client:
        info = client.create_session("proj")
        assert not shell(client, info.session_id, "echo x > /tmp/x; echo w > in-workspace.txt")[0]
    container = stored_container(server, info.session_id)
    kill9(server)
    docker_client.containers.get(container).remove(force=True)
    server = serve()
    with server.client() as client:
        result = client.call(info.session_id, "shell", {"command": "cat in-workspace.txt; ls /tmp/x"})
        text = text_of(result)
        assert "recreated" in text and "gone when the server restarted" in text
        assert "w" in text and "No such file" in text  # the workspace is intact, /tmp is new
        assert not shell(client, info.session_id, "true")[0]


def test_a_command_running_at_kill_9_gets_tool_failed_server_restarted(
    serve: Callable[..., ServeProcess],
) -> None:
    server = serve()
    with server.client() as client:
        info = client.create_session("proj")
        assert not shell(client, info.session_id, "true")[0]  # the container exists
        called = threading.Event()

        def run() -> None:
            try:
                for item in client.dispatch(
                    info.session_id, [ToolUseBlock("napping", "shell", {"command": "sleep 1000"})]
                ):
                    if isinstance(item, Event) and item.type == "tool.called":
                        called.set()
            except Exception:
                pass  # the stream breaks with the server

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert called.wait(30)
        wait_stored(
            server.home,
            "SELECT count(*) FROM running_calls WHERE tool_use_id = 'napping'",
            (),
            lambda row: row[0] == 1,
        )
        kill9(server)
        thread.join(30)
    server = serve()
    with server.client() as client:
        seen = watch_until(
            client, info.session_id, lambda e: e.type == "tool.failed" and e.tool_use_id == "napping"
        )
        assert "server restarted" in event_of(seen[-1], ToolFailed).payload.message
        failed, out = shell(client, info.session_id, COUNT_SLEEPS)
        assert (failed, out.strip()) == (False, "0")  # the command died with its call


def test_a_container_without_a_stored_session_is_still_reaped(
    serve: Callable[..., ServeProcess], docker_client: docker.DockerClient
) -> None:
    instance = serve.instance  # type: ignore[attr-defined]
    server = serve()
    kill9(server)
    stray = docker_client.containers.run(
        DEFAULT_IMAGE,
        ["sleep", "1000"],
        detach=True,
        network_mode="none",
        labels={LABEL_INSTANCE: instance, LABEL_SESSION: "ses_nobody", LABEL_TENANT: "default"},
    )
    try:
        serve()
        assert containers_of(docker_client, instance) == []
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            stray.remove(force=True)


def test_remove_sessions_true_removes_containers_and_sessions(
    serve: Callable[..., ServeProcess], docker_client: docker.DockerClient
) -> None:
    instance = serve.instance  # type: ignore[attr-defined]
    server = serve(remove_sessions=True)
    with server.client() as client:
        info = client.create_session("proj")
        assert not shell(client, info.session_id, "true")[0]
    assert len(containers_of(docker_client, instance)) == 1
    sigterm(server)
    assert containers_of(docker_client, instance) == []
    server = serve(remove_sessions=True)
    with server.client() as client:
        assert client.list_sessions() == []


def test_a_container_made_from_another_config_is_not_readopted(serve: Callable[..., ServeProcess]) -> None:
    server = serve()
    with server.client() as client:
        info = client.create_session("proj")
        assert not shell(client, info.session_id, "echo x > /tmp/x")[0]
    stored_container(server, info.session_id)
    sigterm(server)
    server = serve(sandbox={"pids_limit": 128})  # its limits would no longer be the configured ones
    with server.client() as client:
        result = client.call(info.session_id, "shell", {"command": "ls /tmp/x"})
        text = text_of(result)
        assert "recreated" in text and "configuration" in text and "No such file" in text


def test_a_workspace_renamed_and_replaced_at_kill_9_gets_a_fresh_container_on_the_new_one(
    serve: Callable[..., ServeProcess], docker_client: docker.DockerClient
) -> None:
    server = serve()
    with server.client() as client:
        info = client.create_session("proj", fs=[(".", "rw")])  # grants: launched, never pooled
        assert not shell(client, info.session_id, "echo old > old.txt")[0]
    container = stored_container(server, info.session_id)
    kill9(server)
    # While no server runs, another process of the tenant renames the directory and puts a new
    # one at the session's path.
    [workspace] = [p.parent for p in (server.home / "workspaces").rglob("old.txt")]
    moved = workspace.with_name("proj-moved")
    owner = workspace.stat()
    workspace.rename(moved)
    workspace.mkdir()
    os.chown(workspace, owner.st_uid, owner.st_gid)

    server = serve()
    with server.client() as client:
        result = client.call(info.session_id, "shell", {"command": "echo new > new.txt"})
        text = text_of(result)
        assert not result.is_error, text
        assert "recreated" in text and "no longer saw the session's workspace" in text, text
    assert (workspace / "new.txt").read_text() == "new\n"
    assert sorted(p.name for p in moved.iterdir()) == ["old.txt"]  # the renamed one is untouched
    instance = serve.instance  # type: ignore[attr-defined]
    assert container not in [c.id for c in containers_of(docker_client, instance)]
