"""Issue 20 through gRPC, before the sandbox transport: a session narrows its tenant's egress list
(a wider pattern is INVALID_ARGUMENT), Session shows the effective list, and shell's description
says what the session can reach."""

from __future__ import annotations

import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from dispatcher.v1 import dispatcher_pb2 as pb
from tests.server.conftest import TOKEN_BETA, ServerFactory


async def _create(client: AsyncDispatcherClient, egress_allow: list[str]) -> pb.Session:
    # The Python clients do not take egress_allow yet: the request is built here.
    req = pb.CreateSessionRequest(capabilities=pb.SessionCapabilities(egress_allow=egress_allow))
    resp: pb.CreateSessionResponse = await client._unary(client._stub.CreateSession, req)
    return resp.session


async def _shell_description(client: AsyncDispatcherClient, session_id: str) -> str:
    (shell,) = [t for t in await client.list_tools(session_id) if t.name == "shell"]
    return shell.description


async def test_a_session_narrows_its_tenants_egress_list_and_is_told_what_it_reaches(
    make_server: ServerFactory,
) -> None:
    h = await make_server(egress={"allow": ["pkgs.example.com", "*.example.org"]})
    client = h.client(TOKEN_BETA)
    narrowed = await _create(client, ["A.example.org"])
    assert list(narrowed.capabilities.egress_allow) == ["a.example.org"]
    described = await _shell_description(client, narrowed.session_id)
    assert "to these hosts on ports 80, 443: a.example.org" in described
    assert "other hosts are refused at once" in described
    whole = await _create(client, [])
    assert list(whole.capabilities.egress_allow) == ["*.example.org", "pkgs.example.com"]
    with pytest.raises(RequestFailed) as err:
        await _create(client, ["evil.example"])
    assert err.value.code == "INVALID_ARGUMENT"
    assert "capabilities.egress_allow[0]: 'evil.example' is not within" in err.value.details


async def test_by_default_the_shell_says_there_is_no_network(make_server: ServerFactory) -> None:
    h = await make_server()
    client = h.client(TOKEN_BETA)
    session = await client.create_session()
    assert "Network: none." in await _shell_description(client, session.session_id)
    assert list((await _create(client, [])).capabilities.egress_allow) == []
