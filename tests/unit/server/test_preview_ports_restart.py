"""Open preview ports kept in ``state.db`` and given back at start (``OpenPorts.restore``): the same
token works after a reload; closed, expired and session-ended ports do not come back; rows past a
bound or damaged are dropped (and deleted) with a log line, never a crash."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatcher.server.persistence.state import SessionPersistence
from dispatcher.server.persistence.store import SessionStore, StoredSession
from dispatcher.server.persistence.writer import StateWriter
from dispatcher.server.preview.ports import MAX_PORTS_PER_SESSION, OpenPorts
from dispatcher.server.requests.errors import QuotaExceeded
from tests.polling import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Home:
    """A ``state.db`` with its writer; ``reopen`` is what a server started again on it sees."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.kept: list[SessionPersistence] = []

    def open(self, *sessions: str) -> SessionPersistence:
        """The store, with ``sessions`` stored (again) and written for."""
        store = SessionStore.open(self.path)
        kept = SessionPersistence(store, StateWriter(store, history=100, history_bytes=1 << 20))
        for sid in sessions:
            store.put_session(StoredSession(sid, "t", "w", "/w", "main", {}, 1.0))
            kept.writer.track(sid)
        self.kept.append(kept)
        return kept

    def rows(self) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute(
                "SELECT session_id, port, tenant_id, public, expires, digest FROM preview_ports"
                " ORDER BY session_id, port"
            ).fetchall()
        finally:
            conn.close()

    def insert(self, *row: object) -> None:
        conn = sqlite3.connect(self.path)
        try:
            conn.execute(
                "INSERT INTO preview_ports (session_id, port, tenant_id, public, expires, digest)"
                " VALUES (?,?,?,?,?,?)",
                row,
            )
            conn.commit()
        finally:
            conn.close()


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Home]:
    h = Home(tmp_path / "state.db")
    try:
        yield h
    finally:
        for kept in h.kept:
            kept.close()


def _tenant_t(*live: str) -> dict[str, str]:
    return dict.fromkeys(live, "t")


async def test_an_open_port_and_its_token_come_back_after_a_restart(home: Home) -> None:
    clock = Clock()
    ports = OpenPorts(clock, keeper=home.open("ses_1"))
    entry, token = await ports.open("t", "ses_1", 8000, expires_in=600, public=False)
    # Committed before open returned: nothing is flushed or closed (a kill -9 here loses nothing).
    assert home.rows() == [("ses_1", 8000, "t", 0, 1600.0, entry.digest)]
    assert (
        hashlib.sha256(token.encode()).digest() == entry.digest
        and token.encode() not in repr(home.rows()).encode()
    )

    clock.now = 1300.0
    again = OpenPorts(clock, keeper=home.open("ses_1"))  # the session was given back
    again.restore(_tenant_t("ses_1").get, allow_public=())
    back, expired = again.find("ses_1", 8000)
    assert back is not None and not expired
    assert back.accepts(token) and not back.accepts(token + "x")
    assert (back.tenant_id, back.public, back.expires) == ("t", False, 1600.0)  # the remaining 300 s
    clock.now = 1600.0
    assert again.find("ses_1", 8000) == (None, True)
    assert home.kept[-1].writer.flush() and home.rows() == []  # the expiry deleted its row


async def test_reopening_keeps_only_the_newest_token(home: Home) -> None:
    ports = OpenPorts(Clock(), keeper=home.open("ses_1"))
    _, old = await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    _, new = await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    again = OpenPorts(Clock(), keeper=home.open())
    again.restore(_tenant_t("ses_1").get, allow_public=())
    back, _ = again.find("ses_1", 8000)
    assert back is not None and back.accepts(new) and not back.accepts(old) and back.expires is None


async def test_closed_expired_and_session_ended_ports_do_not_come_back(home: Home) -> None:
    clock = Clock()
    kept = home.open("ses_1", "ses_2", "ses_3")
    ports = OpenPorts(clock, keeper=kept)
    await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    await ports.open("t", "ses_1", 8001, expires_in=10, public=False)
    await ports.open("t", "ses_2", 8000, expires_in=0, public=False)
    await ports.open("t", "ses_3", 8000, expires_in=0, public=False)
    assert await ports.revoke("ses_1", 8000) is not None
    assert [r[:2] for r in home.rows()] == [("ses_1", 8001), ("ses_2", 8000), ("ses_3", 8000)]
    kept.writer.forget(["ses_2"])  # CloseSession: the session's rows, its ports' among them
    assert [r[:2] for r in home.rows()] == [("ses_1", 8001), ("ses_3", 8000)]

    clock.now = 1010.0  # ses_1's 8001 expired while the server was down; ses_3 was not given back
    again = OpenPorts(clock, keeper=home.open())
    again.restore(_tenant_t("ses_1", "ses_2").get, allow_public=())
    assert again.of_session("ses_1") == [] and again.of_session("ses_3") == []
    assert home.rows() == []  # dropped rows are deleted, not kept for the next start


async def test_a_damaged_row_is_skipped_and_the_others_come_back(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    ports = OpenPorts(Clock(), keeper=home.open("ses_1"))
    _, token = await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    home.insert("ses_1", "eighty", "t", 0, None, b"x" * 32)  # not a port
    home.insert("ses_1", 70000, "t", 0, None, b"x" * 32)  # out of range
    home.insert("ses_1", 8002, "t", 0, None, b"short")  # a digest that is not SHA-256
    home.insert("ses_1", 8003, "t", 7, None, b"")  # public neither 0 nor 1
    home.insert("ses_1", 8004, "t", 0, "soon", b"x" * 32)  # an expiry that is not a time
    home.insert("ses_1", 8005, "", 0, None, b"x" * 32)  # no tenant
    again = OpenPorts(Clock(), keeper=home.open())
    with caplog.at_level(logging.WARNING):
        again.restore(_tenant_t("ses_1").get, allow_public=())
    assert [e.port for e in again.of_session("ses_1")] == [8000]
    back, _ = again.find("ses_1", 8000)
    assert back is not None and back.accepts(token)
    assert sum("stored preview port skipped" in r.getMessage() for r in caplog.records) == 6
    assert [r[1] for r in home.rows()] == [8000]


async def test_a_port_of_another_tenant_or_public_no_longer_allowed_is_dropped(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    ports = OpenPorts(Clock(), keeper=home.open("ses_1", "ses_2"))
    await ports.open("t", "ses_1", 8000, expires_in=0, public=True)
    await ports.open("t", "ses_2", 8000, expires_in=0, public=False)
    again = OpenPorts(Clock(), keeper=home.open())
    with caplog.at_level(logging.WARNING):
        # ses_2 now belongs to another tenant (its id reused); public previews are off for "t".
        again.restore({"ses_1": "t", "ses_2": "u"}.get, allow_public=())
    assert again.of_session("ses_1") == [] and again.of_session("ses_2") == []
    messages = [r.getMessage() for r in caplog.records]
    assert any("may no longer open public previews" in m for m in messages)
    assert any("belongs to tenant 'u'" in m for m in messages)
    assert home.rows() == []

    ports = OpenPorts(Clock(), keeper=home.kept[-1])
    home.kept[-1].writer.track("ses_1")
    await ports.open("t", "ses_1", 8000, expires_in=0, public=True)
    allowed = OpenPorts(Clock(), keeper=home.open())
    allowed.restore(_tenant_t("ses_1").get, allow_public=("t",))
    back, _ = allowed.find("ses_1", 8000)
    assert back is not None and back.public and back.digest == b""


async def test_the_per_session_bound_holds_when_opening_and_when_loading(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    ports = OpenPorts(Clock(), keeper=home.open("ses_1", "ses_2"))
    for port in range(1, MAX_PORTS_PER_SESSION + 1):
        await ports.open("t", "ses_1", port, expires_in=0, public=False)
    with pytest.raises(QuotaExceeded, match=f"already has {MAX_PORTS_PER_SESSION} ports open"):
        await ports.open("t", "ses_1", 9999, expires_in=0, public=False)
    await ports.open("t", "ses_1", 1, expires_in=0, public=False)  # reopening one is not one more
    await ports.open("t", "ses_2", 9999, expires_in=0, public=False)  # another session's own bound

    home.insert("ses_1", 9999, "t", 0, None, b"x" * 32)  # written past the bound (an older release)
    again = OpenPorts(Clock(), keeper=home.open())
    with caplog.at_level(logging.WARNING):
        again.restore(_tenant_t("ses_1", "ses_2").get, allow_public=())
    assert len(again.of_session("ses_1")) == MAX_PORTS_PER_SESSION
    assert again.find("ses_1", 9999) == (None, False)
    assert any("ports open already" in r.getMessage() for r in caplog.records)
    assert ("ses_1", 9999) not in [r[:2] for r in home.rows()] and ("ses_2", 9999) in [
        r[:2] for r in home.rows()
    ]


async def test_a_change_queued_for_a_closed_session_writes_nothing(home: Home) -> None:
    kept = home.open("ses_1")
    ports = OpenPorts(Clock(), keeper=kept)
    kept.writer.forget(["ses_1"])  # the session closed while OpenPort was under way
    await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    assert home.rows() == []


async def test_expiry_cuts_and_deletes_without_a_request_and_resumes_after_a_restart(home: Home) -> None:
    ports = OpenPorts(keeper=home.open("ses_1"))  # the wall clock: the timers' own
    soon, _ = await ports.open("t", "ses_1", 8000, expires_in=0.2, public=False)
    await until(soon.cut.is_set, "the expiry to cut the port")
    await until(lambda: home.kept[-1].writer.flush() and home.rows() == [], "the expired row to go")
    assert ports.find("ses_1", 8000) == (None, True)  # a request then is told it expired

    await ports.open("t", "ses_1", 8001, expires_in=3600, public=False)
    await ports.open("t", "ses_1", 8002, expires_in=2, public=False)
    again = OpenPorts(keeper=home.open("ses_1"))
    again.restore(_tenant_t("ses_1").get, allow_public=())
    late, _ = again.find("ses_1", 8001)
    near, _ = again.find("ses_1", 8002)
    assert late is not None and near is not None
    await until(near.cut.is_set, "the remaining time of the port given back to run out")
    assert not late.cut.is_set()
    assert home.kept[-1].writer.flush() and [r[1] for r in home.rows()] == [8001]
