"""Sessions survive a restart of a real ``dispatcher serve`` (kill -9 and SIGTERM); local backend.

The Docker side (the same container, /tmp and processes after a restart) is in
``tests/integration/grpc/test_restart_docker.py``.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.events import ToolConfirmationRequested, ToolFailed, event_of, is_event
from tests.polling import until_sync
from tests.server.conftest import ALL_MODES
from tests.server.helpers import text_of
from tests.server.serve_process import REPO, ServeProcess, start_serve


def local_config(**overrides: Any) -> dict[str, Any]:
    return {
        "sandbox": {"backend": "local"},
        "server": {"grace_seconds": 3},
        "log": {"format": "json", "level": "info"},
        "tool_confirmation": {"default": {"EXECUTE": "auto"}},
        "tools": ["tests.server.tools:make_block_tool"],
        "approval_modes": ALL_MODES,
        **overrides,
    }


def wait_policy(home: Path, session_id: str, fragment: str) -> None:
    """Poll until the session's stored policy JSON holds ``fragment``."""
    query = "SELECT policy FROM sessions WHERE session_id = ?"
    wait_stored(home, query, (session_id,), lambda row: row is not None and fragment in row[0])


def wait_stored(
    home: Path, query: str, args: tuple[Any, ...], ok: Callable[[Any], bool], timeout: float = 20
) -> None:
    """Poll ``state.db`` until ``ok(first row)``: the writer commits in the background."""
    rows: list[Any] = [None]

    def shown() -> bool:
        conn = sqlite3.connect(home / "state.db", timeout=5)
        try:
            rows[0] = conn.execute(query, args).fetchone()
        finally:
            conn.close()
        return ok(rows[0])

    until_sync(shown, f"state.db to show it: {query} {args}", timeout=timeout, interval=0.02)


def wait_seq(home: Path, session_id: str, seq: int) -> None:
    wait_stored(
        home,
        "SELECT last_seq FROM sessions WHERE session_id = ?",
        (session_id,),
        lambda row: row is not None and row[0] >= seq,
    )


def watch_until(client: DispatcherClient, session_id: str, found: Callable[[Event], bool]) -> list[Event]:
    """WatchSession from the start until an event matches; every event seen."""
    seen: list[Event] = []
    stream = client.watch(session_id, after_seq=0)
    assert isinstance(stream, Iterator)
    try:
        for event in stream:
            seen.append(event)
            if found(event):
                return seen
    finally:
        stream.close()  # type: ignore[attr-defined]
    pytest.fail(f"no such event; saw {[(e.seq, e.type) for e in seen]}")


def kill9(server: ServeProcess) -> None:
    server.proc.kill()
    server.close()


def sigterm(server: ServeProcess) -> None:
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    server.close()


@pytest.mark.parametrize("stop", [kill9, sigterm], ids=["kill-9", "sigterm"])
def test_a_session_answers_after_a_restart(tmp_path: Path, stop: Callable[[ServeProcess], None]) -> None:
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            info = client.create_session(
                "proj",
                labels={"team": "a"},
                mode="autonomous",
                tools=["shell", "read_file"],
                fs=[(".", "rw")],
            )
            result = client.call(info.session_id, "shell", {"command": "echo hi > note.txt"})
            assert not result.is_error
            last = client.get_session(info.session_id).last_event_seq
        wait_seq(server.home, info.session_id, last)
    finally:
        stop(server)
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            again = client.get_session(info.session_id)
            assert (again.workspace, again.labels, again.role) == ("proj", {"team": "a"}, info.role)
            assert again.create_time == pytest.approx(info.create_time)
            assert (again.approval_mode, again.capabilities) == ("autonomous", info.capabilities)
            assert again.capabilities.allowed_tools == frozenset({"shell", "read_file"})
            assert again.last_event_seq == last
            assert [s.session_id for s in client.list_sessions()] == [info.session_id]
            replayed = watch_until(client, info.session_id, lambda e: e.seq == last)
            assert [e.seq for e in replayed] == list(range(1, last + 1))  # the history was kept
            result = client.call(info.session_id, "read_file", {"path": "note.txt"})
            assert "hi" in str(result.content)
            assert client.get_session(info.session_id).last_event_seq > last  # seqs go on
            client.close_session(info.session_id)  # CloseSession still ends it, row included
        wait_stored(server.home, "SELECT count(*) FROM sessions", (), lambda row: row[0] == 0)
    finally:
        server.close()


def test_a_call_running_at_kill_9_is_failed_with_server_restarted(tmp_path: Path) -> None:
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            info = client.create_session("proj")
            called = threading.Event()
            items: list[Any] = []

            def run() -> None:
                try:
                    for item in client.dispatch(info.session_id, [ToolUseBlock("blocked", "block", {})]):
                        items.append(item)
                        if isinstance(item, Event) and item.type == "tool.called":
                            called.set()
                except Exception as exc:  # the stream breaks with the server
                    items.append(exc)

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            assert called.wait(30)
            wait_stored(
                server.home,
                "SELECT tool_name FROM running_calls WHERE session_id = ? AND tool_use_id = ?",
                (info.session_id, "blocked"),
                lambda row: row is not None and row[0] == "block",
            )
            kill9(server)
            thread.join(30)
            assert not any(isinstance(i, ToolResultBlock) for i in items)  # no result ever came
    finally:
        server.close()
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            seen = watch_until(
                client, info.session_id, lambda e: e.type == "tool.failed" and e.tool_use_id == "blocked"
            )
            failed = event_of(seen[-1], ToolFailed)
            assert "server restarted" in failed.payload.message
            assert failed.payload.reason == "server_restarted"  # a program need not parse the text
            assert [e.type for e in seen[:1]] == ["tool.called"]  # replayed from the stored history
        wait_stored(server.home, "SELECT count(*) FROM running_calls", (), lambda row: row[0] == 0)
    finally:
        server.close()


def test_a_remembered_answer_survives_a_restart(tmp_path: Path) -> None:
    config = local_config(tool_confirmation={"default": {"EXECUTE": "prompt"}})
    server = start_serve(tmp_path, data=config)
    try:
        with server.client() as client, server.client() as approver:
            info = client.create_session("proj")

            def answer(event: Event) -> None:
                if is_event(event, ToolConfirmationRequested):
                    approver.resolve_confirmation(
                        info.session_id, event.payload.request_id, "allow", remember=True
                    )

            result = client.call(info.session_id, "shell", {"command": "true"}, on_event=answer)
            assert not result.is_error
        wait_policy(server.home, info.session_id, '"shell": "allow"')
    finally:
        kill9(server)
    server = start_serve(tmp_path, data=config)
    try:
        with server.client() as client:
            types: list[str] = []
            result = client.call(
                info.session_id, "shell", {"command": "true"}, on_event=lambda e: types.append(e.type)
            )
            assert not result.is_error
            assert "tool.confirmation_requested" not in types  # remembered, not asked again
    finally:
        server.close()


def test_two_servers_on_one_home_refuse(tmp_path: Path) -> None:
    server = start_serve(tmp_path, data=local_config())
    try:
        second = subprocess.run(
            [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(tmp_path / "serve.yaml")],
            env={"DISPATCHER_HOME": str(server.home), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2
        assert str(server.home) in second.stderr and f"pid {server.proc.pid}" in second.stderr
        with server.client() as client:  # the first one is unharmed
            client.create_session("proj")
    finally:
        server.close()


def test_a_refused_second_server_leaves_uids_json_untouched(tmp_path: Path) -> None:
    from dispatcher.config import hash_token

    def tenant(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "token_sha256": hash_token(f"{name}-token-0123456789"),
            "workspace_root": str(tmp_path / name),
        }

    uids = {"tenant_uids": {"start": 300000, "count": 100}}
    server = start_serve(tmp_path, data=local_config(tenants=[tenant("one")], **uids))
    try:
        before = (server.home / "uids.json").read_bytes()
        assert b"one" in before
        # The second config has a tenant the first never allocated: it would be written in.
        second_config = tmp_path / "second.yaml"
        second_config.write_text(yaml.safe_dump(local_config(tenants=[tenant("one"), tenant("two")], **uids)))
        second = subprocess.run(
            [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(second_config)],
            env={"DISPATCHER_HOME": str(server.home), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2 and "already serving the home" in second.stderr
        assert (server.home / "uids.json").read_bytes() == before
    finally:
        server.close()


def test_a_session_whose_workspace_became_a_link_is_closed_at_start(tmp_path: Path) -> None:
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            info = client.create_session("proj")
    finally:
        kill9(server)
    workspace = Path(info.workspace_path)
    workspace.rename(workspace.with_name("moved"))
    workspace.symlink_to("/etc")
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            assert client.list_sessions() == []
        assert any("stored session closed" in line and "symlink" in line for line in server.stderr)
        wait_stored(server.home, "SELECT count(*) FROM sessions", (), lambda row: row[0] == 0)
    finally:
        server.close()


def test_a_session_of_a_tenant_no_longer_configured_is_closed_at_start(tmp_path: Path) -> None:
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            client.create_session("proj")
    finally:
        sigterm(server)
    other = local_config(
        tenants=[{"id": "other", "token_sha256": ["0" * 64], "workspace_root": str(tmp_path / "other")}]
    )
    server = start_serve(tmp_path, data=other)
    try:
        assert any("stored session closed" in line and "tenant" in line for line in server.stderr)
        wait_stored(server.home, "SELECT count(*) FROM sessions", (), lambda row: row[0] == 0)
    finally:
        server.close()


def test_a_damaged_state_file_stops_the_start_naming_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "state.db").write_bytes(b"garbage" * 1000)
    (tmp_path / "serve.yaml").write_text(yaml.safe_dump(local_config()))
    proc = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(tmp_path / "serve.yaml")],
        env={"DISPATCHER_HOME": str(home), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert str(home / "state.db") in proc.stderr and "damaged" in proc.stderr
    assert (home / "state.db").read_bytes() == b"garbage" * 1000


def test_an_approved_plan_stays_approved_after_a_restart(tmp_path: Path) -> None:
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            info = client.create_session("proj", mode="plan")
            _, mode = client.approve_plan(info.session_id, True)
            assert mode == "autonomous"
        wait_policy(server.home, info.session_id, '"mode_in_force": "autonomous"')
    finally:
        kill9(server)
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client, pytest.raises(RequestFailed) as failed:
            client.approve_plan(info.session_id, True)  # it is no longer in plan mode
        assert "autonomous" in failed.value.details
    finally:
        server.close()


def test_a_proposed_plan_survives_a_restart_and_is_approved_after_it(tmp_path: Path) -> None:
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            info = client.create_session("proj", mode="plan")
            for n in (1, 2):
                proposed = client.call(info.session_id, "write_file", {"path": f"f{n}.txt", "content": "x"})
                assert proposed.is_error and f"step {n}" in text_of(proposed)
        wait_policy(server.home, info.session_id, '"step": 2')
    finally:
        kill9(server)
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            steps, mode = client.approve_plan(info.session_id, True)
            assert [(s.step, s.tool_name) for s in steps] == [(1, "write_file"), (2, "write_file")]
            assert mode == "autonomous" and "f2.txt" in str(steps[1].projected_modifications)
    finally:
        server.close()


def test_staged_changes_survive_kill_9_and_apply_after_it(tmp_path: Path) -> None:
    """Issue 22, item 5: a change the model was told is staged is committed before that answer."""
    from dispatcher.v1 import dispatcher_pb2 as pb

    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            info = client.create_session("proj", mode="review")
            root = Path(info.workspace_path)
            (root / "a.txt").write_text("a\n")
            patched = client.call(info.session_id, "patch_file", {"path": "a.txt", "old": "a", "new": "A"})
            created = client.call(info.session_id, "write_file", {"path": "sub/b.txt", "content": "b\n"})
            assert not patched.is_error and not created.is_error, text_of(patched) + text_of(created)
    finally:
        kill9(server)  # at once: no wait for the background writer
    server = start_serve(tmp_path, data=local_config())
    try:
        with server.client() as client:
            listed = client._unary(
                client._stub.ListStagedChanges, pb.ListStagedChangesRequest(session_id=info.session_id)
            )
            assert [(c.id, c.path) for c in listed.changes] == [
                (patched.metadata["staged"], "a.txt"),
                (created.metadata["staged"], "sub/b.txt"),
            ]
            assert "-a\n+A\n" in listed.changes[0].diff
            read = client.call(info.session_id, "read_file", {"path": "sub/b.txt"})
            assert text_of(read) == "b\n" and not (root / "sub").exists()
            applied = client._unary(
                client._stub.ApplyStagedChanges, pb.ApplyStagedChangesRequest(session_id=info.session_id)
            )
            assert len(applied.applied_ids) == 2 and not applied.refused
            assert (root / "a.txt").read_text() == "A\n" and (root / "sub" / "b.txt").read_text() == "b\n"
        wait_stored(server.home, "SELECT count(*) FROM staged_changes", (), lambda row: row[0] == 0)
    finally:
        server.close()
