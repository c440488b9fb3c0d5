"""A tenant's ``approval_modes``: the modes its sessions may choose, so a platform team can force
confirmation (a session cannot pick autonomous or audit when its tenant does not list them)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.config import hash_token
from dispatcher.config.load import load_config
from dispatcher.core.dispatcher import Decision
from dispatcher.core.errors import ConfigError
from dispatcher.core.events.bus import Event
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from tests.events import ToolConfirmationRequested
from tests.server.conftest import ServerFactory
from tests.server.helpers import next_event, text_of
from tests.server.persistence.test_restart import local_config, sigterm, wait_stored
from tests.server.serve_process import start_serve

TOKEN = "limited-token-0123456789"


OTHER_TOKEN = "other-token-0123456789"


def _other_tenant(modes: list[str] | None, root: Path) -> dict[str, Any]:
    return {**_tenant(modes, root), "id": "other", "token_sha256": hash_token(OTHER_TOKEN)}


def _tenant(modes: list[str] | None, root: Path) -> dict[str, Any]:
    tenant: dict[str, Any] = {"id": "limited", "token_sha256": hash_token(TOKEN), "workspace_root": str(root)}
    if modes is not None:
        tenant["approval_modes"] = modes
    return tenant


async def test_a_session_cannot_choose_a_mode_its_tenant_does_not_allow(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    h = await make_server(tenants=[_tenant(["review", "cautious"], tmp_path / "ws-limited")])
    client = h.client(TOKEN)
    for mode in ("autonomous", "audit", "plan", "manual"):
        with pytest.raises(RequestFailed) as err:
            await client.create_session(mode=mode)
        assert err.value.code == "INVALID_ARGUMENT", mode
        assert f"does not allow {mode!r}" in err.value.details and "review, cautious" in err.value.details
    # Naming none gets the first listed; a listed one is taken.
    assert (await client.create_session()).approval_mode == "review"
    assert (await client.create_session(mode="cautious")).approval_mode == "cautious"
    assert {s.approval_mode for s in await client.list_sessions()} == {"review", "cautious"}


async def test_an_approved_plan_does_not_widen_past_the_tenants_modes(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    h = await make_server(tenants=[_tenant(["plan", "cautious"], tmp_path / "ws-limited")])
    client = h.client(TOKEN)
    s = await client.create_session(mode="plan")
    held = await client.call(s.session_id, "write_file", {"path": "p.txt", "content": "x"})
    assert held.is_error and "step 1" in text_of(held)
    steps, mode = await client.approve_plan(s.session_id, Decision.ALLOW)
    assert len(steps) == 1 and mode == "cautious"  # not autonomous: the tenant does not allow it
    assert (await client.get_session(s.session_id)).approval_mode == "cautious"
    # The write now asks, as the tenant's policy says for a cautious session.
    call = asyncio.create_task(
        _collect(
            client.dispatch(
                s.session_id, [ToolUseBlock("w", "write_file", {"path": "p.txt", "content": "x"})]
            )
        )
    )
    request = await next_event(client, s.session_id, ToolConfirmationRequested)
    await client.resolve_confirmation(s.session_id, str(request.payload.request_id), Decision.ALLOW)
    items = await asyncio.wait_for(call, 20)
    (result,) = [i for i in items if isinstance(i, ToolResultBlock)]
    assert not result.is_error, text_of(result)


async def test_a_plan_cannot_be_approved_whole_where_only_plan_is_allowed(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    h = await make_server(tenants=[_tenant(["plan"], tmp_path / "ws-limited")])
    client = h.client(TOKEN)
    s = await client.create_session()
    assert s.approval_mode == "plan"
    await client.call(s.session_id, "write_file", {"path": "p.txt", "content": "x"})
    with pytest.raises(RequestFailed) as err:
        await client.approve_plan(s.session_id, Decision.ALLOW)
    assert err.value.code == "FAILED_PRECONDITION" and "answer each call" in err.value.details
    assert (await client.get_session(s.session_id)).approval_mode == "plan"
    steps, mode = await client.approve_plan(s.session_id, Decision.DENY)  # rejecting still works
    assert len(steps) == 1 and mode == "plan"


async def test_by_default_a_caller_cannot_lower_the_operators_bar(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    """Issue 22 item 2: without ``approval_modes`` a session may not choose autonomous or audit
    (they would run unasked what the operator's policy asks about); the refusal names the key."""
    h = await make_server(approval_modes=None, tenants=[_tenant(None, tmp_path / "ws-limited")])
    client = h.client(TOKEN)
    for mode in ("autonomous", "audit"):
        with pytest.raises(RequestFailed) as err:
            await client.create_session(mode=mode)
        assert err.value.code == "INVALID_ARGUMENT", mode
        assert f"does not allow {mode!r}" in err.value.details
        assert "tenants[0].approval_modes" in err.value.details, err.value.details
    for mode in ("cautious", "manual", "review", "plan"):
        assert (await client.create_session(mode=mode)).approval_mode == mode
    assert (await client.create_session()).approval_mode == "cautious"


async def test_the_top_level_approval_modes_allow_a_mode_for_tenants_without_their_own(
    make_server: ServerFactory, tmp_path: Path
) -> None:
    h = await make_server(
        approval_modes=["cautious", "autonomous"],
        tenants=[_tenant(None, tmp_path / "ws-limited"), _other_tenant(["cautious"], tmp_path / "ws-o")],
    )
    assert (await h.client(TOKEN).create_session(mode="autonomous")).approval_mode == "autonomous"
    with pytest.raises(RequestFailed) as err:
        await h.client(OTHER_TOKEN).create_session(mode="autonomous")
    assert "tenants[1].approval_modes" in err.value.details


def test_the_default_tenant_refusal_names_the_top_level_key(tmp_path: Path) -> None:
    data = local_config()
    del data["approval_modes"]
    server = start_serve(tmp_path, data=data)
    try:
        with DispatcherClient(server.target, home=str(server.home)) as client:
            with pytest.raises(RequestFailed) as err:
                client.create_session("w", mode="autonomous")
            assert err.value.code == "INVALID_ARGUMENT"
            assert "top-level approval_modes" in err.value.details, err.value.details
            # An approved plan then runs as cautious: its calls ask as the operator configured.
            s = client.create_session("w", mode="plan")
            client.call(s.session_id, "write_file", {"path": "p.txt", "content": "x"})
            _, mode = client.approve_plan(s.session_id, Decision.ALLOW)
            assert mode == "cautious"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("modes", "needle"),
    [
        (["autonomous", "yolo"], "unknown approval mode 'yolo'"),
        ([], "non-empty list"),
        ("cautious", "non-empty list"),
        (["review", "review"], "'review' is listed twice"),
    ],
)
def test_a_bad_approval_modes_list_is_a_config_error_naming_it(
    tmp_path: Path, modes: Any, needle: str
) -> None:
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"tenants": [_tenant(modes, tmp_path / "ws")]}))
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    assert "tenants[0].approval_modes" in str(err.value) and needle in str(err.value)


def test_a_stored_session_whose_mode_is_no_longer_allowed_is_closed_at_start(tmp_path: Path) -> None:
    root = tmp_path / "ws-limited"
    server = start_serve(tmp_path, data=local_config(tenants=[_tenant(None, root)]))
    try:
        with DispatcherClient(server.target, token=TOKEN, home=str(server.home)) as client:
            kept = client.create_session("kept", mode="cautious")
            client.create_session("gone", mode="autonomous")
    finally:
        sigterm(server)
    server = start_serve(tmp_path, data=local_config(tenants=[_tenant(["cautious", "review"], root)]))
    try:
        with DispatcherClient(server.target, token=TOKEN, home=str(server.home)) as client:
            assert [s.session_id for s in client.list_sessions()] == [kept.session_id]
        assert any("stored session closed" in line and "'autonomous'" in line for line in server.stderr)
        wait_stored(server.home, "SELECT count(*) FROM sessions", (), lambda row: row[0] == 1)
    finally:
        server.close()


async def _collect(items: Any) -> list[Event | ToolResultBlock]:
    return [item async for item in items]
