"""A session's process memory (its shell's directory and variables, what its model last read of
each process) survives ``kill -9`` of a real server: stored in ``state.db`` as it changes, given
back with the session."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml

from dispatcher.server.persistence.migrations import SCHEMA_VERSION
from tests.server.helpers import text_of
from tests.server.persistence.test_restart import kill9, local_config, wait_stored
from tests.server.serve_process import REPO, start_serve


def test_the_shell_state_and_read_cursors_survive_kill_9(tmp_path: Path) -> None:
    config = local_config(tools=["tests.server.tools:make_remember_tool"])
    server = start_serve(tmp_path, data=config)
    try:
        with server.client() as client:
            sid = client.create_session("proj", mode="autonomous").session_id
            told = {
                "cwd": "src/app",
                "env": {"API": "http://127.0.0.1:8000"},
                "read": {"p_1": 42},
                "ask": ["p_1"],
            }
            result = client.call(sid, "remember", told)
            assert json.loads(text_of(result)) == {
                "cwd": "src/app",
                "env": {"API": "http://127.0.0.1:8000"},
                "cursors": {"p_1": 42},
            }
        wait_stored(
            server.home,
            "SELECT processes FROM sessions WHERE session_id = ?",
            (sid,),
            lambda row: row is not None and '"p_1": 42' in row[0],
        )
    finally:
        kill9(server)
    server = start_serve(tmp_path, data=config)
    try:
        with server.client() as client:
            again = json.loads(text_of(client.call(sid, "remember", {"ask": ["p_1", "p_2"]})))
            assert again == {
                "cwd": "src/app",
                "env": {"API": "http://127.0.0.1:8000"},
                "cursors": {"p_1": 42, "p_2": 0},
            }
    finally:
        server.close()
    assert SCHEMA_VERSION >= 4  # the process memory came with migration 4


def test_a_damaged_process_memory_stops_the_start_naming_the_session(tmp_path: Path) -> None:
    config = local_config()
    server = start_serve(tmp_path, data=config)
    try:
        with server.client() as client:
            sid = client.create_session("proj").session_id
    finally:
        kill9(server)
    conn = sqlite3.connect(server.home / "state.db")
    conn.execute("UPDATE sessions SET processes = ? WHERE session_id = ?", ('{"cwd": 3}', sid))
    conn.commit()
    conn.close()
    (tmp_path / "again.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(tmp_path / "again.yaml")],
        env={"DISPATCHER_HOME": str(server.home), "PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert sid in proc.stderr and "damaged" in proc.stderr and "processes.cwd" in proc.stderr
