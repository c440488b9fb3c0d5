"""Issue 20 through gRPC, before the sandbox transport: a session narrows its tenant's egress list
(a wider pattern is INVALID_ARGUMENT), Session shows the effective list, and shell's description
says what the session can reach."""

from __future__ import annotations

import pytest

from dispatcher.client import AsyncDispatcherClient, RequestFailed
from tests.server.conftest import TOKEN_BETA, ServerFactory


async def _create(client: AsyncDispatcherClient, egress_allow: list[str]) -> tuple[str, list[str]]:
    """The new session's id and its effective egress list."""
    info = await client.create_session(egress_allow=egress_allow)
    return info.session_id, list(info.capabilities.egress_allow or ())


async def _shell_description(client: AsyncDispatcherClient, session_id: str) -> str:
    (shell,) = [t for t in await client.list_tools(session_id) if t.name == "shell"]
    return shell.description


async def test_a_session_narrows_its_tenants_egress_list_and_is_told_what_it_reaches(
    make_server: ServerFactory,
) -> None:
    h = await make_server(egress={"allow": ["pkgs.example.com", "*.example.org"]})
    client = h.client(TOKEN_BETA)
    narrowed, allowed = await _create(client, ["A.example.org"])
    assert allowed == ["a.example.org"]
    described = await _shell_description(client, narrowed)
    assert "to these hosts on ports 80, 443: a.example.org" in described
    assert "other hosts are refused at once" in described
    _, whole = await _create(client, [])
    assert whole == ["*.example.org", "pkgs.example.com"]
    with pytest.raises(RequestFailed) as err:
        await _create(client, ["evil.example"])
    assert err.value.code == "INVALID_ARGUMENT"
    assert "capabilities.egress_allow[0]: 'evil.example' is not within" in err.value.details


async def test_by_default_the_shell_says_there_is_no_network(make_server: ServerFactory) -> None:
    h = await make_server()
    client = h.client(TOKEN_BETA)
    session = await client.create_session()
    assert "Network: none." in await _shell_description(client, session.session_id)
    assert (await _create(client, []))[1] == []
