"""The preview gateway's open ports (``server/preview/ports.py``): tokens kept only as hashes and
accepted exactly, reopening replaces the token, expiry on the clock given, and every way a port
ends cuts its connections."""

from __future__ import annotations

import hashlib

from dispatcher.server.preview.ports import OpenPorts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_token_is_kept_as_its_hash_and_accepted_exactly() -> None:
    ports = OpenPorts()
    entry, token = await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    assert len(token) >= 40 and token not in repr(entry.__dict__)
    assert entry.digest == hashlib.sha256(token.encode()).digest()
    assert entry.accepts(token)
    assert not entry.accepts(token[:-1]) and not entry.accepts(token + "x") and not entry.accepts("")
    assert not entry.accepts("\udcff")  # a lone surrogate from a hostile query: refused, no error


async def test_reopening_replaces_the_token_and_cuts_the_old_connections() -> None:
    ports = OpenPorts()
    first, old = await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    second, new = await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    assert first.cut.is_set() and not second.cut.is_set()
    assert new != old and not second.accepts(old) and second.accepts(new)


async def test_expiry_follows_the_clock_and_says_it_expired() -> None:
    clock = Clock()
    ports = OpenPorts(clock)
    entry, _ = await ports.open("t", "ses_1", 8000, expires_in=60, public=False)
    assert entry.expires == 1060.0
    clock.now = 1059.9
    assert ports.find("ses_1", 8000) == (entry, False)
    clock.now = 1060.0
    assert ports.find("ses_1", 8000) == (None, True) and entry.cut.is_set()
    assert ports.find("ses_1", 8000) == (None, False)  # gone: no longer "expired"


async def test_the_sessions_end_closes_only_its_ports() -> None:
    ports = OpenPorts()
    a, _ = await ports.open("t", "ses_1", 8000, expires_in=0, public=False)
    b, _ = await ports.open("t", "ses_1", 9000, expires_in=0, public=True)
    c, _ = await ports.open("t", "ses_2", 8000, expires_in=0, public=False)
    assert [e.port for e in ports.of_session("ses_1")] == [8000, 9000]
    ports.close_session("ses_1")
    assert a.cut.is_set() and b.cut.is_set() and not c.cut.is_set()
    assert ports.of_session("ses_1") == [] and ports.of_session("ses_2") == [c]
    assert ports.close("ses_1", 8000) is None
