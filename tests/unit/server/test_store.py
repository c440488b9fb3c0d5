"""``state.db``: schema migrations, refusal of damaged or newer files, round trips, the writer."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.core.events import payloads as ep
from dispatcher.core.events.bus import Event
from dispatcher.server.persistence.errors import StateError
from dispatcher.server.persistence.home_lock import HomeLock
from dispatcher.server.persistence.migrations import MIGRATIONS, SCHEMA_VERSION
from dispatcher.server.persistence.store import SessionStore, StoredSession
from dispatcher.server.persistence.stored_policy import plan_from_json, policy_to_json, remembered_from_json
from dispatcher.server.persistence.writer import StateWriter


def _row(session_id: str = "ses_1", **kw: object) -> StoredSession:
    fields: dict[str, object] = {
        "session_id": session_id,
        "tenant_id": "alpha",
        "workspace": "a/b",
        "workspace_path": "/srv/alpha/a/b",
        "role": "main",
        "labels": {"k": "v"},
        "create_time": 1700000000.5,
        "policy": policy_to_json({"shell": "allow", "write_file": "deny"}),
        **kw,
    }
    return StoredSession(**fields)  # type: ignore[arg-type]


_DEFAULTS: dict[str, dict[str, object]] = {
    "tool.called": {"tool_name": "shell", "side_effect": "execute", "input": {}},
    "tool.completed": {"tool_name": "shell", "duration_ms": 1.0},
    "tool.output_delta": {"stream": "stdout", "text": ""},
    "tool.confirmation_requested": {
        "request_id": "r",
        "tool_name": "shell",
        "input_summary": "x",
        "side_effect": "write",
        "projected_modifications": (),
    },
}


def _event(
    session_id: str, seq: int, type: str = "tool.called", tool_use_id: str = "t1", **payload: object
) -> Event:
    fields = {**_DEFAULTS[type], **payload}
    return Event(seq, 1.0 + seq, session_id, "turn", tool_use_id, ep.PAYLOAD_TYPES[type](**fields), 300)  # type: ignore[arg-type]


def test_a_new_file_gets_the_current_schema_in_wal_mode(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "state.db")
    store.close()
    conn = sqlite3.connect(tmp_path / "state.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert (tmp_path / "state.db").stat().st_mode & 0o777 == 0o600


def test_session_rows_round_trip(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "state.db")
    store.put_session(_row("ses_1", container_id="c1", last_seq=7))
    store.put_session(_row("ses_2", create_time=1700000001.0))
    store.close()
    loaded = SessionStore.open(tmp_path / "state.db").load()
    assert [s.session_id for s in loaded] == ["ses_1", "ses_2"]
    first = loaded[0]
    assert (first.tenant_id, first.workspace, first.role, first.labels) == (
        "alpha",
        "a/b",
        "main",
        {"k": "v"},
    )
    assert (first.container_id, first.last_seq, first.create_time) == ("c1", 7, 1700000000.5)
    assert remembered_from_json(first.policy) == {"shell": "allow", "write_file": "deny"}


def test_the_writer_keeps_events_running_calls_and_updates(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "state.db")
    store.put_session(_row("ses_1"))
    writer = StateWriter(store, history=3, history_bytes=1 << 20)
    writer.track("ses_1")
    writer.on_event(_event("ses_1", 1, tool_use_id="done"))
    writer.on_event(_event("ses_1", 2, "tool.completed", tool_use_id="done"))
    writer.on_event(_event("ses_1", 3, tool_use_id="running"))
    writer.on_event(
        _event("ses_1", 4, "tool.confirmation_requested", tool_use_id="asking", tool_name="write_file")
    )
    writer.on_event(_event("ses_other", 1))  # not tracked (closed): never written
    writer.update("ses_1", "container_id", "abc")
    writer.close()  # drains the queue
    [stored] = SessionStore.open(tmp_path / "state.db").load()
    assert [e.seq for e in stored.events] == [2, 3, 4]  # history bound 3: the oldest left
    assert stored.last_seq == 4 and stored.container_id == "abc"
    assert stored.events[-1].payload == ep.ToolConfirmationRequested("r", "write_file", "x", "write", ())
    assert sorted((c.tool_use_id, c.tool_name) for c in stored.running) == [
        ("asking", "write_file"),
        ("running", "shell"),
    ]


def test_output_past_the_queue_bound_is_not_stored_but_calls_still_end(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "state.db")
    store.put_session(_row("ses_1"))
    writer = StateWriter(store, history=100, history_bytes=1 << 20, max_queued_bytes=1_000)
    writer.track("ses_1")
    with store.lock:  # the thread cannot write meanwhile: everything stays queued
        writer.on_event(_event("ses_1", 1, tool_use_id="t1"))
        for seq in range(2, 12):
            writer.on_event(_event("ses_1", seq, "tool.output_delta", tool_use_id="t1", text="x"))
        writer.on_event(_event("ses_1", 12, "tool.completed", tool_use_id="t1"))
    writer.close()
    [stored] = SessionStore.open(tmp_path / "state.db").load()
    # 300 bytes each: the call start and two deltas fit 1,000; later deltas wait for nobody
    assert [e.seq for e in stored.events] == [1, 2, 3, 12]
    assert stored.last_seq == 12 and stored.running == []


def test_a_session_whose_last_events_were_not_stored_still_continues_after_them(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "state.db")
    store.put_session(_row("ses_1"))
    writer = StateWriter(store, history=100, history_bytes=1 << 20, max_queued_bytes=400)
    writer.track("ses_1")
    with store.lock:
        for seq in range(1, 6):
            writer.on_event(_event("ses_1", seq, "tool.output_delta", tool_use_id="t1", text="x"))
    writer.close()
    [stored] = SessionStore.open(tmp_path / "state.db").load()
    assert [e.seq for e in stored.events] == [1]
    assert stored.last_seq == 5  # a restarted bus starts at 6: no seq a watcher saw is reused


def test_forget_deletes_a_session_and_what_it_had(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "state.db")
    store.put_session(_row("ses_1"))
    writer = StateWriter(store, history=10, history_bytes=1 << 20)
    writer.track("ses_1")
    writer.on_event(_event("ses_1", 1))
    assert writer.flush()
    writer.forget(["ses_1"])
    writer.on_event(_event("ses_1", 2))  # a late event of the closed session
    writer.close()
    assert SessionStore.open(tmp_path / "state.db").load() == []
    conn = sqlite3.connect(tmp_path / "state.db")
    assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM running_calls").fetchone()[0] == 0


def test_a_newer_schema_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SessionStore.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StateError, match=rf"{path}.*schema version {SCHEMA_VERSION + 1}.*newer"):
        SessionStore.open(path)


def test_a_damaged_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not a database at all" * 200)
    before = path.read_bytes()
    with pytest.raises(StateError, match=rf"{path}.*damaged"):
        SessionStore.open(path)
    assert path.read_bytes() == before  # nothing dropped silently


def test_a_file_missing_its_tables_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SessionStore.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE running_calls")
    conn.commit()
    conn.close()
    with pytest.raises(StateError, match="missing tables: running_calls"):
        SessionStore.open(path)


def test_a_damaged_row_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SessionStore.open(path)
    store.put_session(_row())
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE sessions SET labels = '[not json'")
    conn.commit()
    conn.close()
    with pytest.raises(StateError, match="damaged"):
        SessionStore.open(path).load()


def test_a_symlink_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.db"
    SessionStore.open(target).close()
    (tmp_path / "state.db").symlink_to(target)
    with pytest.raises(StateError, match="not a regular file"):
        SessionStore.open(tmp_path / "state.db")


def test_a_sessions_process_memory_is_stored_updated_and_read_back(tmp_path: Path) -> None:
    store = SessionStore.open(tmp_path / "state.db")
    store.put_session(_row("ses_1", processes={"cwd": "src", "env": {}, "cursors": {}}))
    writer = StateWriter(store, history=3, history_bytes=1 << 20)
    writer.track("ses_1")
    writer.update("ses_1", "processes", {"cwd": None, "env": {"A": "1"}, "cursors": {"p_1": 9}})
    writer.close()
    [stored] = SessionStore.open(tmp_path / "state.db").load()
    assert stored.processes == {"cwd": None, "env": {"A": "1"}, "cursors": {"p_1": 9}}


def test_a_version_3_file_gains_an_empty_process_memory_per_session(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in ";".join(MIGRATIONS[:3]).split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 3")
    conn.execute(
        "INSERT INTO sessions (session_id, tenant_id, workspace, workspace_path, role, labels, create_time)"
        " VALUES ('ses_old', 'alpha', 'a', '/srv/a', 'main', '{}', 1.0)"
    )
    conn.close()
    [stored] = SessionStore.open(path).load()
    assert stored.session_id == "ses_old" and stored.processes == {}


def test_an_older_schema_is_migrated_keeping_its_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dispatcher.server.persistence import migrations

    path = tmp_path / "state.db"
    store = SessionStore.open(path)
    store.put_session(_row())
    store.close()
    extra = "CREATE TABLE notes (session_id TEXT PRIMARY KEY, note TEXT)"
    monkeypatch.setattr(migrations, "MIGRATIONS", (*MIGRATIONS, extra))
    monkeypatch.setattr(migrations, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    migrated = SessionStore.open(path)
    assert [s.session_id for s in migrated.load()] == ["ses_1"]
    migrated.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
    assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 0


def test_a_second_lock_on_a_home_names_the_holder(tmp_path: Path) -> None:
    first = HomeLock(tmp_path)
    first.acquire()
    # Another process: flock conflicts between open file descriptions, as between two servers.
    code = (
        "import sys; from pathlib import Path; from dispatcher.server.persistence.home_lock import HomeLock;"
        f"HomeLock(Path({str(tmp_path)!r})).acquire()"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert f"pid {os.getpid()}" in proc.stderr and str(tmp_path) in proc.stderr
    first.release()
    again = HomeLock(tmp_path)
    again.acquire()  # released: free again
    again.release()


def test_a_sessions_own_policy_fields_round_trip() -> None:
    from dispatcher.core.capabilities import Capabilities, FsGrant
    from dispatcher.core.sessions.session import Session
    from dispatcher.server.persistence.stored_policy import mode_in_force_from_json, session_fields_from_json

    caps = Capabilities(frozenset({"shell"}), (FsGrant("src", "rw"), FsGrant(".", "r")))
    session = Session("ses_1", "/w", approval_mode="plan", capabilities=caps)
    stored = policy_to_json({"shell": "deny"}, session)
    assert remembered_from_json(stored) == {"shell": "deny"}
    assert session_fields_from_json(stored) == {"approval_mode": "plan", "capabilities": caps}
    assert mode_in_force_from_json(stored) is None
    approved = policy_to_json({}, session, "autonomous")  # an approved plan runs as autonomous
    assert mode_in_force_from_json(approved) == "autonomous"
    with pytest.raises(ValueError, match=r"capabilities\.fs"):
        session_fields_from_json({"capabilities": {"tools": None, "fs": [["src", "wx"]]}})


# Each type as the previous version stored it (json.dumps of its payload dict), byte for byte.
_STORED_BEFORE = {
    "tool.called": '{"tool_name": "shell", "side_effect": "execute", "input": {"command": "ls"}}',
    "tool.output_delta": '{"stream": "stderr", "text": "hi"}',
    "tool.completed": '{"tool_name": "shell", "duration_ms": 12.5}',
    "tool.failed": '{"tool_name": "shell", "error_class": "execution_error", "message": "server restarted: x", '
    '"reason": "server restarted", "duration_ms": 0.0}',
    "tool.input_invalid": '{"tool_name": "write_file", "errors": ["$.path: required"]}',
    "tool.confirmation_requested": '{"request_id": "cr_1", "tool_name": "write_file", "input_summary": "x", '
    '"side_effect": "write", "projected_modifications": ["a.txt"], "diff": "--- a"}',
    "tool.confirmation_resolved": '{"request_id": "", "decision": "allow", "reason": "remembered"}',
    "tool.step_proposed": '{"step": 1, "tool_name": "shell", "input_summary": "ls", "side_effect": "execute", '
    '"projected_modifications": []}',
}


def _store_with_event(tmp_path: Path, type: str, payload_json: str) -> Path:
    path = tmp_path / "state.db"
    store = SessionStore.open(path)
    store.put_session(_row())
    store.close()
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO events (session_id, seq, time, turn_id, tool_use_id, type, payload, size)"
        " VALUES (?,?,?,?,?,?,?,?)",
        (_row().session_id, 1, 1.0, "turn", "tu", type, payload_json, 300),
    )
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize("type_", sorted(_STORED_BEFORE))
def test_events_stored_by_the_previous_version_load_typed_and_store_back_the_same(
    tmp_path: Path, type_: str
) -> None:
    import json

    path = _store_with_event(tmp_path, type_, _STORED_BEFORE[type_])
    [stored] = SessionStore.open(path).load()
    [event] = stored.events
    assert event.type == type_ and type(event.payload) is ep.PAYLOAD_TYPES[type_]
    assert ep.to_dict(event.payload) == json.loads(_STORED_BEFORE[type_])  # the same keys written back


@pytest.mark.parametrize(
    ("type_", "payload_json", "needle"),
    [
        ("tool.completed", '{"tool_name": "shell"}', "'duration_ms' is missing"),
        ("tool.completed", '{"tool_name": "shell", "duration_ms": "fast"}', "not a number"),
        ("tool.input_invalid", '{"tool_name": "x", "errors": "oops"}', "not a list of strings"),
        ("tool.called", '["not", "an", "object"]', "not an object"),
        ("tool.exploded", "{}", "unknown event type"),
        ("tool.completed", "[not json", "Expecting value"),
    ],
)
def test_a_damaged_event_row_is_skipped_with_a_log_line_and_the_rest_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, type_: str, payload_json: str, needle: str
) -> None:
    path = _store_with_event(tmp_path, type_, payload_json)
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO events (session_id, seq, time, turn_id, tool_use_id, type, payload, size)"
        " VALUES (?,?,?,?,?,?,?,?)",
        (
            _row().session_id,
            2,
            2.0,
            "turn",
            "tu",
            "tool.output_delta",
            '{"stream": "stdout", "text": "ok"}',
            300,
        ),
    )
    conn.commit()
    conn.close()
    with caplog.at_level("WARNING", logger="dispatcher.server"):
        [stored] = SessionStore.open(path).load()
    assert [e.seq for e in stored.events] == [2]  # the damaged one is gone, the good one kept
    assert stored.events[0].payload == ep.ToolOutputDelta("stdout", "ok")
    assert stored.last_seq >= 2
    [record] = [r for r in caplog.records if "stored event skipped" in r.getMessage()]
    assert needle in record.getMessage() and getattr(record, "seq", None) == 1


def test_a_plan_is_stored_and_read_back_and_a_damaged_step_ends_it() -> None:
    from dispatcher.core.sessions.state import PlanStep

    steps = [
        PlanStep(n, "t", f"toolu_{n}", "write_file", "write", f"write_file {n}", (f"f{n}.txt",))
        for n in (1, 2, 3)
    ]
    stored = policy_to_json({}, None, None, steps)
    assert plan_from_json(stored) == steps
    assert "plan" not in policy_to_json({}, None, None, [])  # nothing stored for no plan
    damaged = {**stored, "plan": [stored["plan"][0], {**stored["plan"][1], "step": 7}, stored["plan"][2]]}
    assert plan_from_json(damaged) == steps[:1]  # not renumbered: the rest is dropped
    for bad in (
        "x",
        [1],
        [{**stored["plan"][0], "input_summary": 5}],
        [{**stored["plan"][0], "tool_name": "x" * 300}],
    ):
        assert plan_from_json({"plan": bad}) == []
