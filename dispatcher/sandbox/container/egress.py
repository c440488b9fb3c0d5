"""The session's egress listener in its agent, the same on both hosts: the agent listens on the
sandbox's loopback and hands each connection to the server's egress proxy over its channel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.egress.gate import EgressGate
from dispatcher.sandbox.agent.protocol import TUNNEL_PORT
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import CA_TARGET
from dispatcher.sandbox.tunnels import tunnel_setup


class Closable(Protocol):
    """The stream under an agent channel (a docker exec's, a Pod attach's)."""

    def close(self) -> None: ...


async def open_tunnels(
    egress: EgressGate | None,
    session: Session,
    channel: AgentChannel,
    stream: Closable,
    has_ca: Callable[[], Awaitable[bool]],
) -> None:
    """The session's egress listener in its agent, when the server has an egress proxy; the CA
    bundle's variables only if ``has_ca()`` (the sandbox has it at ``CA_TARGET``). Both backends'.

    Raises:
        SandboxError: the agent refused it (the channel and its stream are closed).
    """
    setup = tunnel_setup(egress, session, ca_path=lambda _: CA_TARGET)
    if setup is None:
        return
    env = setup.env
    if env and not await has_ca():
        env = {}
    try:
        await channel.open_tunnels(setup.serve, port=TUNNEL_PORT, env=env)
    except SandboxError:
        with contextlib.suppress(Exception):
            await channel.close()
        stream.close()
        raise
