"""Authentication, tenant isolation, workspace names, tool allow-lists and quotas."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import grpc
import pytest

from dispatcher.client import RequestFailed
from dispatcher.config import hash_token
from dispatcher.core.dispatcher import Decision
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from tests.events import ToolOutputDelta
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, TOKEN_TINY, Harness, ServerFactory, base_config
from tests.server.helpers import next_event, text_of


@pytest.mark.parametrize(
    "metadata", [(), (("authorization", "Bearer wrong-token"),), (("authorization", TOKEN_ALPHA),)]
)
async def test_missing_or_bad_token_is_unauthenticated(
    harness: Harness, metadata: tuple[tuple[str, str], ...]
) -> None:
    async with grpc.aio.insecure_channel(harness.target) as channel:
        stub = pb_grpc.ToolDispatcherStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CreateSession(pb.CreateSessionRequest(), metadata=metadata)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.WatchSession(pb.WatchSessionRequest(session_id="x"), metadata=metadata):
                pass
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_other_tenants_sessions_do_not_exist(harness: Harness) -> None:
    alpha, beta = harness.client(TOKEN_ALPHA), harness.client(TOKEN_BETA)
    session = await alpha.create_session("secret")
    sid = session.session_id
    assert await beta.list_sessions() == []
    attempts = [
        beta.get_session(sid),
        beta.list_tools(sid),
        beta.close_session(sid),
        beta.cancel(sid),
        beta.resolve_confirmation(sid, "req", Decision.ALLOW),
        beta.call(sid, "echo", {"text": "x"}),
        _drain(beta.watch(sid)),
    ]
    for attempt in attempts:
        with pytest.raises(RequestFailed) as err:
            await attempt
        assert err.value.code == "NOT_FOUND", err.value
    assert (await alpha.get_session(sid)).session_id == sid  # untouched


async def test_workspaces_live_under_the_tenant_root(harness: Harness) -> None:
    alpha, beta = harness.client(TOKEN_ALPHA), harness.client(TOKEN_BETA)
    a = await alpha.create_session("shared-name")
    b = await beta.create_session("shared-name")
    assert a.workspace_path != b.workspace_path
    assert a.workspace_path.startswith(str((harness.tmp / "ws-alpha").resolve()))
    await alpha.call(a.session_id, "shell", {"command": "echo alpha > mine.txt"})
    result = await beta.call(b.session_id, "read_file", {"path": "mine.txt"})
    assert result.is_error and str(result.error_class) == "execution_error"


@pytest.mark.parametrize(
    "name", ["../beta", "/etc", "a/../../x", "~root", "a\\b", "..", "ok/../..", ".hidden"]
)
async def test_workspace_names_cannot_escape(harness: Harness, name: str) -> None:
    with pytest.raises(RequestFailed) as err:
        await harness.client().create_session(name)
    assert err.value.code == "INVALID_ARGUMENT"


async def test_symlinked_workspace_out_of_the_root_is_refused(harness: Harness) -> None:
    root = harness.tmp / "ws-alpha"
    root.mkdir(exist_ok=True)
    os.symlink(harness.tmp, root / "link")
    with pytest.raises(RequestFailed) as err:
        await harness.client().create_session("link")
    assert err.value.code == "INVALID_ARGUMENT"


async def test_a_symlink_planted_inside_a_workspace_cannot_steer_creation_outside(harness: Harness) -> None:
    # A sandbox can write symlinks into its own workspace; naming a nested workspace through one
    # must neither be accepted nor create anything where it points.
    root = harness.tmp / "ws-alpha"
    (root / "mine").mkdir(parents=True, exist_ok=True)
    target = harness.tmp / "elsewhere"
    target.mkdir()
    os.symlink(target, root / "mine" / "planted")
    with pytest.raises(RequestFailed) as err:
        await harness.client().create_session("mine/planted/new")
    assert err.value.code == "INVALID_ARGUMENT"
    assert list(target.iterdir()) == []


async def test_tool_allow_list(harness: Harness) -> None:
    tiny = harness.client(TOKEN_TINY)
    session = await tiny.create_session()
    assert {t.name for t in await tiny.list_tools(session.session_id)} == {
        "read_file",
        "list_dir",
        "echo",
        "block",
    }
    result = await tiny.call(session.session_id, "shell", {"command": "true"})
    assert result.is_error and str(result.error_class) in ("permission_denied", "not_found")


async def test_session_quota(harness: Harness) -> None:
    tiny = harness.client(TOKEN_TINY)
    first = await tiny.create_session()
    with pytest.raises(RequestFailed) as err:
        await tiny.create_session("second")
    assert err.value.code == "RESOURCE_EXHAUSTED"
    await tiny.close_session(first.session_id)
    await tiny.create_session("second")  # a closed session frees its slot


async def test_concurrent_dispatch_quota(harness: Harness) -> None:
    tiny, watcher = harness.client(TOKEN_TINY), harness.client(TOKEN_TINY)
    session = await tiny.create_session()
    blocked = asyncio.create_task(tiny.call(session.session_id, "block", {}))
    await next_event(watcher, session.session_id, ToolOutputDelta)
    with pytest.raises(RequestFailed) as err:
        await tiny.call(session.session_id, "echo", {"text": "x"})
    assert err.value.code == "RESOURCE_EXHAUSTED"
    await tiny.cancel(session.session_id)
    assert str((await asyncio.wait_for(blocked, 10)).error_class) == "cancelled"
    assert text_of(await tiny.call(session.session_id, "echo", {"text": "free again"})) == "free again"


async def test_tokens_are_not_stored(harness: Harness) -> None:
    for path in harness.tmp.glob("config-*.yaml"):
        text = path.read_text()
        assert TOKEN_ALPHA not in text and TOKEN_BETA not in text


async def _drain(stream: object) -> None:
    async for _ in stream:  # type: ignore[attr-defined]
        pass


async def test_filesystem_grants(make_server: ServerFactory, tmp_path: Path) -> None:
    grants = {
        "id": "scoped",
        "token_sha256": hash_token("scoped-token-0123456789"),
        "workspace_root": "ws-scoped",  # relative: under the server's home
        "fs": [{"path": "src", "mode": "rw"}, {"path": ".", "mode": "r"}],
        "tool_confirmation": {"default": {"WRITE": "auto"}},
    }
    h = await make_server(tenants=[*base_config(tmp_path)["tenants"], grants])
    client = h.client("scoped-token-0123456789")
    session = await client.create_session()
    assert not (
        await client.call(session.session_id, "write_file", {"path": "src/ok.txt", "content": "1"})
    ).is_error
    denied = await client.call(session.session_id, "write_file", {"path": "top.txt", "content": "1"})
    assert denied.is_error and str(denied.error_class) == "permission_denied"
    assert not (await client.call(session.session_id, "read_file", {"path": "src/ok.txt"})).is_error
    assert session.workspace_path == str((tmp_path / "home" / "ws-scoped" / "default").resolve())


async def test_interleaved_calls_of_two_tenants_never_mix(harness: Harness) -> None:
    alpha, beta = harness.client(TOKEN_ALPHA), harness.client(TOKEN_BETA)
    a = await alpha.create_session("a")
    b = await beta.create_session("b")
    lists = await asyncio.gather(*(c.list_sessions() for _ in range(40) for c in (alpha, beta)))
    for i, sessions in enumerate(lists):
        expected = a if i % 2 == 0 else b
        assert [s.session_id for s in sessions] == [expected.session_id]
