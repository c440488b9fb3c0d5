"""Durable session state in ``<home>/state.db``: SQLite (stdlib), WAL, its schema brought up to date
by ``migrations.py``.

What one row keeps is what a restarted server needs to give a session back: identity, tenant,
workspace, role, labels, create time, the per-session policy state (remembered confirmation
answers, the mode in force, the proposed plan; see ``stored_policy.py``), the container it owns,
its shell's directory and variables and what its model last read of each process
(``core/sessions/processes.py``), its last event seq, its bounded event
history, the tool calls that were running, and its staged changes (review and audit modes); beside
the sessions, each port open to the preview gateway (its token's SHA-256, never the token). The file is the server's own, but it may be stale
or damaged: anything unreadable refuses the start (``StateError``, exit 2) rather than dropping
state silently.

Writes: session rows are written before CreateSession answers (``put_session``), staged changes
before the staging call answers (``put_staged``); events, running
calls, container ids, the processes' state and the preview ports go through ``StateWriter`` (``writer.py``), a background thread that
commits in batches.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import stat
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import payload_from_dict
from dispatcher.core.staging.area import ChangeKind, StagedChange
from dispatcher.server.persistence.errors import StateError
from dispatcher.server.persistence.migrations import check_tables, migrate

log = logging.getLogger("dispatcher.server")

STATE_FILE = "state.db"


@dataclass(frozen=True, slots=True)
class RunningCall:
    tool_use_id: str
    turn_id: str
    tool_name: str


@dataclass(slots=True)
class StoredSession:
    """One session as the store keeps it."""

    session_id: str
    tenant_id: str
    workspace: str
    workspace_path: str
    role: str
    labels: dict[str, str]
    create_time: float
    policy: dict[str, Any] = field(default_factory=dict)
    """Per-session policy state (``policy_to_json``): remembered answers and what else a session
    carries of its own."""
    container_id: str | None = None
    last_seq: int = 0
    lifecycle: dict[str, Any] = field(default_factory=dict)
    """Its clocks (``SessionClock.to_json``); empty: a row from before sessions had clocks."""
    processes: dict[str, Any] = field(default_factory=dict)
    """Its shell state and last-read cursors (``ProcessMemory.to_json``); empty: none yet."""
    events: list[Event] = field(default_factory=list)
    running: list[RunningCall] = field(default_factory=list)
    staged: list[StagedChange] = field(default_factory=list)
    """Its staged changes (review/audit), oldest first."""


@dataclass(frozen=True, slots=True)
class StoredPort:
    """One port open to the preview gateway, as the store keeps it."""

    tenant_id: str
    session_id: str
    port: int
    public: bool
    expires: float | None
    """Wall-clock seconds; None: until closed."""
    digest: bytes
    """SHA-256 of the token (empty when public)."""


class SessionStore:
    """The open ``state.db``: one connection shared by the event loop and the writer thread."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.path = path
        self._conn = conn
        self.lock = threading.Lock()
        """Held around every statement batch (the loop and the writer thread share ``_conn``)."""

    @classmethod
    def open(cls, path: Path) -> SessionStore:
        """Open (or create) the store and bring its schema up to date.

        Raises:
            StateError: naming the file: not a regular file, damaged, or written by a newer
                dispatcher (an unknown schema version).
        """
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise StateError(f"{path}: session state is not a regular file; refusing to use it")
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        except sqlite3.Error as exc:
            raise StateError(f"{path}: cannot open the session state: {exc}") from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL: a committed transaction survives the process being killed; only an OS
            # crash may lose the last ones. Events are batched anyway.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=OFF")
            migrate(conn, path)
            check_tables(conn, path)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StateError(
                f"{path}: the session state is damaged ({exc}); move it away to start without the"
                " stored sessions (their containers are then removed as orphans)"
            ) from exc
        except StateError:
            conn.close()
            raise
        os.chmod(path, 0o600)
        return cls(conn, path)

    def close(self) -> None:
        with self.lock:
            self._conn.close()

    # -- rows -----------------------------------------------------------------------------

    def put_session(self, row: StoredSession) -> None:
        """Insert (or replace) a session row and commit (before CreateSession answers)."""
        with self.lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO sessions (session_id, tenant_id, workspace, workspace_path, role,"
                " labels, create_time, policy, container_id, last_seq, lifecycle, processes)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    row.session_id,
                    row.tenant_id,
                    row.workspace,
                    row.workspace_path,
                    row.role,
                    json.dumps(row.labels),
                    row.create_time,
                    json.dumps(row.policy),
                    row.container_id,
                    row.last_seq,
                    json.dumps(row.lifecycle),
                    json.dumps(row.processes),
                ),
            )

    def delete_sessions(self, session_ids: Iterable[str]) -> None:
        """Forget sessions: their rows, events and running calls."""
        ids = [(sid,) for sid in session_ids]
        if not ids:
            return
        with self.lock:
            self._conn.execute("BEGIN")
            try:
                for table in ("sessions", "events", "running_calls", "staged_changes", "preview_ports"):
                    self._conn.executemany(f"DELETE FROM {table} WHERE session_id = ?", ids)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def load(self) -> list[StoredSession]:
        """Every stored session with its event history and running calls, oldest first.

        Raises:
            StateError: a row cannot be read (damaged file or values).
        """
        try:
            with self.lock:
                rows = self._conn.execute(
                    "SELECT session_id, tenant_id, workspace, workspace_path, role, labels, create_time,"
                    " policy, container_id, last_seq, lifecycle, processes FROM sessions"
                    " ORDER BY create_time"
                ).fetchall()
                sessions = {r[0]: _session_from_row(r) for r in rows}
                for r in self._conn.execute(
                    "SELECT session_id, seq, time, turn_id, tool_use_id, type, payload, size FROM events"
                    " ORDER BY session_id, seq"
                ):
                    s = sessions.get(r[0])
                    if s is None:
                        continue
                    try:
                        payload = payload_from_dict(r[5], json.loads(r[6]))
                    except (ValueError, TypeError) as exc:
                        # One damaged event costs its replay, not the server's start.
                        log.warning(
                            "stored event skipped: %s",
                            exc,
                            extra={"session_id": r[0], "seq": r[1], "path": str(self.path)},
                        )
                        continue
                    s.events.append(Event(r[1], r[2], r[0], r[3], r[4], payload, r[7]))
                for r in self._conn.execute(
                    "SELECT session_id, tool_use_id, turn_id, tool_name FROM running_calls"
                ):
                    s = sessions.get(r[0])
                    if s is not None:
                        s.running.append(RunningCall(r[1], r[2], r[3]))
                for r in self._conn.execute(
                    "SELECT session_id, change_id, path, kind, base_sha256, data, diff, staged_at,"
                    " tool_name, tool_use_id FROM staged_changes ORDER BY rowid"
                ):
                    s = sessions.get(r[0])
                    if s is not None:
                        s.staged.append(_staged_from_row(r))
        except (sqlite3.DatabaseError, ValueError, TypeError, KeyError) as exc:
            raise StateError(f"{self.path}: the session state is damaged ({exc})") from exc
        for s in sessions.values():
            # The seq goes on from the highest one ever given, whichever was written last.
            if s.events:
                s.last_seq = max(s.last_seq, s.events[-1].seq)
        return list(sessions.values())

    def put_staged(self, session_id: str, change: StagedChange) -> None:
        """Keep a staged change (committed on return: a change the model was told is staged
        survives a kill); one staged again keeps its place in the order."""
        with self.lock:
            self._conn.execute(
                "INSERT INTO staged_changes (session_id, change_id, path, kind, base_sha256, data, diff,"
                " staged_at, tool_name, tool_use_id) VALUES (?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (session_id, change_id) DO UPDATE SET path = excluded.path,"
                " kind = excluded.kind, base_sha256 = excluded.base_sha256, data = excluded.data,"
                " diff = excluded.diff, staged_at = excluded.staged_at, tool_name = excluded.tool_name,"
                " tool_use_id = excluded.tool_use_id",
                (
                    session_id,
                    change.change_id,
                    change.path,
                    change.kind.value,
                    change.base_sha256,
                    change.data,
                    change.diff,
                    change.staged_at,
                    change.tool_name,
                    change.tool_use_id,
                ),
            )

    def delete_staged(self, session_id: str, change_ids: Sequence[str]) -> None:
        """Forget staged changes (applied or discarded)."""
        with self.lock:
            self._conn.executemany(
                "DELETE FROM staged_changes WHERE session_id = ? AND change_id = ?",
                [(session_id, change_id) for change_id in change_ids],
            )

    def put_snapshot(self, row: Sequence[Any]) -> None:
        """Insert a snapshot's row (its files are complete) and commit."""
        with self.lock:
            self._conn.execute(
                "INSERT INTO snapshots (snapshot_id, tenant_id, name, source_session_id, create_time,"
                " size_bytes, has_tmp) VALUES (?,?,?,?,?,?,?)",
                tuple(row),
            )

    def delete_snapshot(self, snapshot_id: str) -> None:
        with self.lock:
            self._conn.execute("DELETE FROM snapshots WHERE snapshot_id = ?", (snapshot_id,))

    def load_snapshots(self) -> list[tuple[Any, ...]]:
        """Every snapshot's row, oldest first."""
        with self.lock:
            return list(
                self._conn.execute(
                    "SELECT snapshot_id, tenant_id, name, source_session_id, create_time, size_bytes,"
                    " has_tmp FROM snapshots ORDER BY create_time"
                )
            )

    def load_ports(self) -> list[StoredPort]:
        """Every stored preview port, in the order they were (re)opened. A row that cannot be read
        is deleted with a log line: a damaged row costs its port, never the server's start."""
        with self.lock:
            rows = self._conn.execute(
                "SELECT rowid, tenant_id, session_id, port, public, expires, digest FROM preview_ports"
                " ORDER BY rowid"
            ).fetchall()
            ports: list[StoredPort] = []
            for r in rows:
                try:
                    ports.append(_port_from_row(r[1:]))
                except ValueError as exc:
                    log.warning("stored preview port skipped: %s", exc, extra={"path": str(self.path)})
                    self._conn.execute("DELETE FROM preview_ports WHERE rowid = ?", (r[0],))
            return ports

    def delete_ports(self, keys: Iterable[tuple[str, int]]) -> None:
        """Forget preview ports by (session id, port)."""
        with self.lock:
            self._conn.executemany("DELETE FROM preview_ports WHERE session_id = ? AND port = ?", list(keys))

    # -- used by the writer thread (under ``lock``) ----------------------------------------

    def write_batch(
        self,
        events: Sequence[tuple[Any, ...]],
        pruned: Mapping[str, int],
        started: Sequence[tuple[str, str, str, str]],
        ended: Sequence[tuple[str, str]],
        last_seqs: Mapping[str, int],
        updates: Sequence[tuple[str, str, Any]],
        ports: Sequence[tuple[str, int, StoredPort | None]] = (),
    ) -> None:
        """One transaction: new events, history pruned below a seq, running calls started and
        ended, last seqs, single-column session updates ``(session_id, column, value)``, and
        preview ports opened (a row) or closed (None), in the order given."""
        conn = self._conn
        conn.execute("BEGIN")
        try:
            if events:
                conn.executemany(
                    "INSERT OR REPLACE INTO events (session_id, seq, time, turn_id, tool_use_id, type,"
                    " payload, size) VALUES (?,?,?,?,?,?,?,?)",
                    events,
                )
            if pruned:
                conn.executemany("DELETE FROM events WHERE session_id = ? AND seq <= ?", list(pruned.items()))
            if started:
                conn.executemany(
                    "INSERT OR REPLACE INTO running_calls (session_id, tool_use_id, turn_id, tool_name)"
                    " VALUES (?,?,?,?)",
                    started,
                )
            if ended:
                conn.executemany("DELETE FROM running_calls WHERE session_id = ? AND tool_use_id = ?", ended)
            if last_seqs:
                conn.executemany(
                    "UPDATE sessions SET last_seq = MAX(last_seq, ?) WHERE session_id = ?",
                    [(seq, sid) for sid, seq in last_seqs.items()],
                )
            for sid, column, value in updates:
                if column not in ("container_id", "policy", "lifecycle", "processes"):
                    raise ValueError(f"not an updatable column: {column}")
                conn.execute(f"UPDATE sessions SET {column} = ? WHERE session_id = ?", (value, sid))
            for sid, port, row in ports:
                if row is None:
                    conn.execute("DELETE FROM preview_ports WHERE session_id = ? AND port = ?", (sid, port))
                else:
                    conn.execute(
                        "INSERT OR REPLACE INTO preview_ports (session_id, port, tenant_id, public, expires,"
                        " digest) VALUES (?,?,?,?,?,?)",
                        (sid, port, row.tenant_id, int(row.public), row.expires, row.digest),
                    )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def _session_from_row(r: Sequence[Any]) -> StoredSession:
    labels = json.loads(r[5])
    policy = json.loads(r[7])
    lifecycle = json.loads(r[10])
    processes = json.loads(r[11])
    if not all(isinstance(v, dict) for v in (labels, policy, lifecycle, processes)):
        raise ValueError(f"session {r[0]!r}: labels, policy, lifecycle and processes must be objects")
    return StoredSession(
        session_id=str(r[0]),
        tenant_id=str(r[1]),
        workspace=str(r[2]),
        workspace_path=str(r[3]),
        role=str(r[4]),
        labels={str(k): str(v) for k, v in labels.items()},
        create_time=float(r[6]),
        policy=policy,
        container_id=str(r[8]) if r[8] else None,
        last_seq=int(r[9]),
        lifecycle=lifecycle,
        processes=processes,
    )


def _port_from_row(r: Sequence[Any]) -> StoredPort:
    """A ``preview_ports`` row (tenant, session, port, public, expires, digest), checked: SQLite
    keeps whatever a column is given.

    Raises:
        ValueError: a value of the wrong type or out of range.
    """
    tenant_id, session_id, port, public, expires, digest = r
    if not (isinstance(tenant_id, str) and tenant_id and isinstance(session_id, str) and session_id):
        raise ValueError(f"preview port of session {session_id!r}: its tenant or session id is not text")
    if type(port) is not int or not 1 <= port <= 65535:
        raise ValueError(f"preview port of session {session_id!r}: {port!r} is not a port")
    if public not in (0, 1) or type(public) is not int:
        raise ValueError(f"preview port {port} of session {session_id!r}: public is {public!r}")
    if expires is not None and (type(expires) not in (int, float) or not math.isfinite(expires)):
        raise ValueError(f"preview port {port} of session {session_id!r}: expires is {expires!r}")
    if not isinstance(digest, bytes) or len(digest) != (0 if public else 32):
        raise ValueError(f"preview port {port} of session {session_id!r}: its token digest is damaged")
    return StoredPort(
        tenant_id, session_id, port, bool(public), float(expires) if expires is not None else None, digest
    )


def _staged_from_row(r: Sequence[Any]) -> StagedChange:
    if not isinstance(r[5], bytes):
        raise ValueError(f"staged change {r[1]!r}: its content is not bytes")
    return StagedChange(
        change_id=str(r[1]),
        path=str(r[2]),
        kind=ChangeKind(r[3]),
        base_sha256=str(r[4]),
        data=r[5],
        diff=str(r[6]),
        staged_at=float(r[7]),
        tool_name=str(r[8]),
        tool_use_id=str(r[9]),
    )
