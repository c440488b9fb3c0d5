"""Retry-safe CreateSession ids: bounded per tenant, forgotten after their ten minutes."""

from __future__ import annotations

import pytest

from dispatcher.server.requests.errors import AlreadyExists
from dispatcher.server.sessions import create_requests
from dispatcher.server.sessions.create_requests import REQUEST_ID_TTL, CreateRequests


def test_a_tenants_flood_of_ids_does_not_push_out_another_tenants(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(create_requests, "MAX_REMEMBERED", 3)
    ids = CreateRequests(clock=lambda: 0.0)
    ids.remember("a", "keep", "fp", "ses_a")
    for i in range(10):
        ids.remember("b", f"r{i}", "fp", f"ses_b{i}")
    assert ids.find("a", "keep", "fp") == "ses_a"
    assert ids.find("b", "r0", "fp") is None  # b's oldest went, within b's own bound
    assert ids.find("b", "r9", "fp") == "ses_b9"
    with pytest.raises(AlreadyExists):
        ids.find("a", "keep", "other request")


def test_an_id_is_forgotten_after_its_ten_minutes() -> None:
    now = [0.0]
    ids = CreateRequests(clock=lambda: now[0])
    ids.remember("a", "r", "fp", "ses_1")
    now[0] = REQUEST_ID_TTL - 1
    assert ids.find("a", "r", "fp") == "ses_1"
    now[0] = REQUEST_ID_TTL + 1
    assert ids.find("a", "r", "another request") is None
