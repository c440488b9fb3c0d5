"""A real ``dispatcher serve`` with ``sandbox.backend: kubernetes`` against the stand-in: the tools,
uploads and downloads, a confirmation, and a ``kill -9`` restart that re-adopts the Pod (same Pod,
its /tmp and background processes intact), as the Docker tests do with containers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.client import DispatcherClient
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_SESSION
from tests.events import EventOf, ToolConfirmationRequested, is_event
from tests.kube_standin import StandIn
from tests.kube_standin.selectors import parse_selector
from tests.kube_standin.store import POD
from tests.kubernetes.backend_fixtures import IMAGE
from tests.kubernetes.test_kubernetes_backend import COUNT_SLEEPS
from tests.polling import until_sync
from tests.server.helpers import text_of
from tests.server.persistence.test_restart import kill9, wait_stored
from tests.server.serve_process import ServeProcess, start_serve

pytestmark = pytest.mark.docker


@pytest.fixture
def kserve(
    tmp_path: Path, standin: StandIn, namespace: str, kubeconfig: Path
) -> Iterator[Callable[..., ServeProcess]]:
    """Start ``dispatcher serve`` on the stand-in (same home, same instance each time)."""
    instance = f"kserve-{namespace}"
    started: list[ServeProcess] = []

    def go(**config: Any) -> ServeProcess:
        data = {
            "sandbox": {
                "backend": "kubernetes",
                "image": IMAGE,
                "instance": instance,
                "workspace_quota": "64m",
                "kubernetes": {"namespace": namespace, "kubeconfig": str(kubeconfig)},
            },
            "server": {"grace_seconds": 2},
            "log": {"format": "json", "level": "info"},
            "tool_confirmation": {"default": {"EXECUTE": "auto", "WRITE": "auto"}},
            **config,
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


def shell(client: DispatcherClient, session_id: str, command: str) -> tuple[bool, str]:
    result = client.call(session_id, "shell", {"command": command})
    return result.is_error, text_of(result)


def pods(standin: StandIn, namespace: str, **labels: str) -> list[str]:
    """Names of the Pods in the stand-in's store with these labels."""
    selector = parse_selector(",".join(f"{k}={v}" for k, v in labels.items()))

    async def names() -> list[str]:
        return [p["metadata"]["name"] for p in standin.store.list(POD, namespace, selector)]

    return list(standin.call(names()))


def test_kubernetes_serve_tools_transfers_and_a_kill_9_restart(
    kserve: Callable[..., ServeProcess], standin: StandIn, namespace: str, tmp_path: Path
) -> None:
    server = kserve()
    instance = kserve.instance  # type: ignore[attr-defined]
    local = tmp_path / "up"
    (local / "pkg").mkdir(parents=True)
    (local / "pkg" / "mod.py").write_text("print('uploaded')\n")
    with server.client() as client:
        info = client.create_session("proj")
        sid = info.session_id
        assert not client.call(sid, "write_file", {"path": "a.txt", "content": "alpha\n"}).is_error
        assert "alpha" in text_of(client.call(sid, "read_file", {"path": "a.txt"}))
        assert not client.call(sid, "patch_file", {"path": "a.txt", "old": "alpha", "new": "beta"}).is_error
        assert "a.txt" in text_of(client.call(sid, "list_dir", {"path": "."}))
        summary = client.upload(sid, str(local), "src")
        assert summary.files == 1
        failed, out = shell(client, sid, "python3 src/pkg/mod.py; cat a.txt")
        assert (failed, out.split()) == (False, ["uploaded", "beta"])
        got = client.download(sid, "src", str(tmp_path / "down"))
        assert got.files == 1 and (tmp_path / "down" / "pkg" / "mod.py").read_text() == "print('uploaded')\n"
        failed, _ = shell(client, sid, "echo kept > /tmp/keep.txt; sleep 1000 >/dev/null 2>&1 &")
        assert not failed
    wait_stored(
        server.home,
        "SELECT container_id FROM sessions WHERE session_id = ?",
        (sid,),
        lambda row: row is not None and bool(row[0]),
    )
    before = pods(standin, namespace, **{LABEL_INSTANCE: instance})
    assert before == pods(standin, namespace, **{LABEL_SESSION: sid}) and len(before) == 1
    kill9(server)

    server = kserve()
    with server.client() as client:
        failed, out = shell(client, sid, "cat /tmp/keep.txt")
        assert (failed, out.strip()) == (False, "kept"), "".join(server.stderr)[-4000:]
        failed, out = shell(client, sid, COUNT_SLEEPS)
        assert (failed, out.strip()) == (False, "1")  # the background process still runs
        assert pods(standin, namespace, **{LABEL_INSTANCE: instance}) == before  # re-adopted, not new
        client.close_session(sid)
    until_sync(
        lambda: pods(standin, namespace, **{LABEL_INSTANCE: instance}) == [], "the Pod deleted", timeout=30
    )


def test_kubernetes_serve_confirmation_then_run(kserve: Callable[..., ServeProcess]) -> None:
    server = kserve(tool_confirmation={"default": {"EXECUTE": "prompt"}})
    with server.client() as client:
        sid = client.create_session("proj").session_id
        asked: list[EventOf[ToolConfirmationRequested]] = []
        result: ToolResultBlock | None = None
        for item in client.dispatch(sid, [ToolUseBlock("t1", "shell", {"command": "echo approved"})]):
            if is_event(item, ToolConfirmationRequested):
                asked.append(item)
                client.resolve_confirmation(sid, str(item.payload.request_id), True)
            elif isinstance(item, ToolResultBlock):
                result = item
        assert asked and result is not None and not result.is_error
        assert "approved" in json.dumps(text_of(result))
