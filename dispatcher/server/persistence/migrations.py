"""The schema of ``state.db``: its migrations, applied in order, and the check that a file has them.

A file's ``PRAGMA user_version`` is the number of migrations it has had; a newer one than this
dispatcher knows is refused rather than read wrongly (it was written by a newer release).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dispatcher.server.persistence.errors import StateError

MIGRATIONS: tuple[str, ...] = (
    # 1: sessions, their event history and the calls running in them.
    """
    CREATE TABLE sessions (
        session_id     TEXT PRIMARY KEY,
        tenant_id      TEXT NOT NULL,
        workspace      TEXT NOT NULL,
        workspace_path TEXT NOT NULL,
        role           TEXT NOT NULL,
        labels         TEXT NOT NULL,
        create_time    REAL NOT NULL,
        policy         TEXT NOT NULL DEFAULT '{}',
        container_id   TEXT,
        last_seq       INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE events (
        session_id  TEXT NOT NULL,
        seq         INTEGER NOT NULL,
        time        REAL NOT NULL,
        turn_id     TEXT NOT NULL,
        tool_use_id TEXT NOT NULL,
        type        TEXT NOT NULL,
        payload     TEXT NOT NULL,
        size        INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE running_calls (
        session_id  TEXT NOT NULL,
        tool_use_id TEXT NOT NULL,
        turn_id     TEXT NOT NULL,
        tool_name   TEXT NOT NULL,
        PRIMARY KEY (session_id, tool_use_id)
    ) WITHOUT ROWID;
    """,
    # 2: the changes review and audit sessions staged and nobody applied or discarded yet.
    """
    CREATE TABLE staged_changes (
        session_id  TEXT NOT NULL,
        change_id   TEXT NOT NULL,
        path        TEXT NOT NULL,
        kind        TEXT NOT NULL,
        base_sha256 TEXT NOT NULL,
        data        BLOB NOT NULL,
        diff        TEXT NOT NULL,
        staged_at   REAL NOT NULL,
        tool_name   TEXT NOT NULL,
        tool_use_id TEXT NOT NULL,
        PRIMARY KEY (session_id, change_id)
    );
    """,
    # 3: each session's clocks (TTL, idle, paused; core/sessions/clock.py), as JSON.
    """
    ALTER TABLE sessions ADD COLUMN lifecycle TEXT NOT NULL DEFAULT '{}';
    """,
    # 4: each session's shell state and its model's last-read cursors (core/sessions/processes.py).
    """
    ALTER TABLE sessions ADD COLUMN processes TEXT NOT NULL DEFAULT '{}';
    """,
    # 5: snapshots of sessions (server/sessions/snapshots/): their files live under the home.
    """
    CREATE TABLE snapshots (
        snapshot_id       TEXT PRIMARY KEY,
        tenant_id         TEXT NOT NULL,
        name              TEXT NOT NULL,
        source_session_id TEXT NOT NULL,
        create_time       REAL NOT NULL,
        size_bytes        INTEGER NOT NULL,
        has_tmp           INTEGER NOT NULL
    );
    """,
    # 6: the ports open to the preview gateway (server/preview/ports.py): the token's SHA-256 only.
    """
    CREATE TABLE preview_ports (
        session_id TEXT NOT NULL,
        port       INTEGER NOT NULL,
        tenant_id  TEXT NOT NULL,
        public     INTEGER NOT NULL,
        expires    REAL,
        digest     BLOB NOT NULL,
        PRIMARY KEY (session_id, port)
    );
    """,
)
"""Schema version N is ``MIGRATIONS[:N]`` applied in order; append, never edit."""
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the migrations ``conn`` has not had yet, each in its own transaction.

    Raises:
        StateError: the file has a schema version newer than this dispatcher knows.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StateError(
            f"{path}: the session state has schema version {version}, newer than this dispatcher knows"
            f" ({SCHEMA_VERSION}): it was written by a newer release; run that one, or move the file away"
        )
    for target in range(version + 1, SCHEMA_VERSION + 1):
        conn.execute("BEGIN")
        try:
            for statement in MIGRATIONS[target - 1].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {target}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def check_tables(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a file whose schema version is current but whose tables are not all there."""
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = {"sessions", "events", "running_calls", "staged_changes", "snapshots", "preview_ports"} - names
    if missing:
        raise StateError(
            f"{path}: the session state is damaged (missing tables: {', '.join(sorted(missing))})"
        )
