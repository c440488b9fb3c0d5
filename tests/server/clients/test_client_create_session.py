"""Both Python clients' ``create_session`` set every field of CreateSessionRequest, against a real
server on loopback: capabilities (tools, fs, egress_allow), clocks (ttl, idle timeout, on_expire),
the approval mode and the retry-safe request id."""

from __future__ import annotations

import asyncio

import pytest

from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.client.base import create_request
from dispatcher.core.capabilities import FsGrant
from dispatcher.core.types import Role
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.polling import until
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, ServerFactory


def test_the_request_carries_every_field_of_the_proto() -> None:
    req = create_request(
        "w",
        Role.WORKER,
        {"a": "b"},
        "manual",
        ["read_file"],
        [("src", "r")],
        egress_allow=["pkgs.example.com"],
        ttl_seconds=0,
        idle_timeout_seconds=30,
        on_expire="pause",
        request_id="req-9",
        snapshot_id="snap_1",
    )
    given = {field.name for field, _ in req.ListFields()}  # set, or non-default where no presence
    assert given == set(pb.CreateSessionRequest.DESCRIPTOR.fields_by_name)
    assert req.HasField("ttl_seconds") and req.ttl_seconds == 0  # 0 (no TTL) is not "unset"
    assert req.on_expire == pb.ON_EXPIRE_PAUSE
    bare = create_request("", Role.MAIN, None, None, None, None)
    assert not bare.HasField("ttl_seconds") and not bare.HasField("idle_timeout_seconds")
    assert (bare.on_expire, bare.request_id, bare.HasField("capabilities")) == (
        pb.ON_EXPIRE_UNSPECIFIED,
        "",
        False,
    )


async def test_the_async_client_sets_clocks_egress_and_a_retry_safe_id(make_server: ServerFactory) -> None:
    h = await make_server(egress={"allow": ["pkgs.example.com", "*.example.org"]})
    client = h.client(TOKEN_BETA)
    info = await client.create_session(
        "clocks",
        labels={"k": "v"},
        tools=["shell", "read_file"],
        fs=[(".", "rw")],
        egress_allow=["a.example.org"],
        ttl_seconds=600,
        idle_timeout_seconds=300,
        on_expire="close",
        request_id="req-1",
    )
    assert info.expire_time is not None and 590 <= info.expire_time - info.create_time <= 610
    assert info.idle_expire_time is not None
    assert info.capabilities.egress_allow == ("a.example.org",)
    assert info.capabilities.allowed_tools == frozenset({"shell", "read_file"})
    assert info.capabilities.fs_grants == (FsGrant(".", "rw"),)
    again = await client.create_session(
        "clocks",
        labels={"k": "v"},
        tools=["shell", "read_file"],
        fs=[(".", "rw")],
        egress_allow=["a.example.org"],
        ttl_seconds=600,
        idle_timeout_seconds=300,
        on_expire="close",
        request_id="req-1",
    )
    assert again.session_id == info.session_id
    with pytest.raises(RequestFailed) as err:
        await client.create_session("clocks", request_id="req-1")  # the same id, another request
    assert err.value.code == "ALREADY_EXISTS"
    with pytest.raises(RequestFailed) as err:
        await client.create_session(egress_allow=["evil.example"])
    assert err.value.code == "INVALID_ARGUMENT"


async def test_on_expire_pause_reaches_the_server(make_server: ServerFactory) -> None:
    h = await make_server()
    client = h.client()
    info = await client.create_session(ttl_seconds=1, on_expire="pause")

    async def paused() -> bool:
        return (await client.get_session(info.session_id)).paused

    await until(paused, "the session to be paused, not closed, when its TTL ran out")


async def test_the_blocking_client_sets_the_same_fields(make_server: ServerFactory) -> None:
    h = await make_server()

    def create() -> tuple[str, str, float | None, float | None]:
        with DispatcherClient(h.target, token=TOKEN_ALPHA, home=str(h.tmp / "nohome")) as client:
            first = client.create_session(
                "sync", ttl_seconds=0, idle_timeout_seconds=120, on_expire="pause", request_id="req-s"
            )
            again = client.create_session(
                "sync", ttl_seconds=0, idle_timeout_seconds=120, on_expire="pause", request_id="req-s"
            )
            return first.session_id, again.session_id, first.expire_time, first.idle_expire_time

    first, again, expire, idle = await asyncio.to_thread(create)
    assert first == again
    assert expire is None  # ttl_seconds=0: no TTL, whatever the server's default
    assert idle is not None
