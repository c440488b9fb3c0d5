"""Attaching the agent in a started container: the ``docker exec`` stream, its first ping and
protocol version, and the session's egress listener.

The agent is started with an attached ``docker exec`` (stdin/stdout/stderr, no tty); its stream goes
through the Docker daemon, so nothing in the sandbox can redirect it to a host path, and it works
under gVisor, which cannot reach host unix sockets by default. Used by ``ContainerLauncher``
(``launch.py``) for a session's container, by the warm pool (``pool.py``) for one made before any
session, and after a restart for a re-adopted container.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.session import Session
from dispatcher.egress.gate import EgressGate
from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION, TUNNEL_PORT
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.config import WORKSPACE_ROOT, SandboxConfig
from dispatcher.sandbox.docker.image_check import HOW_TO_BUILD, ImageUnusable, version_mismatch
from dispatcher.sandbox.docker.stream import AttachStream, open_attach_stream
from dispatcher.sandbox.tunnels import tunnel_setup

log = logging.getLogger(__name__)

_MISSING_EXECUTABLE = {126, 127}
CA_TARGET = "/opt/dispatcher/ca-bundle.crt"
"""Where a tenant's ``egress.ca_bundle`` is mounted (read-only) in its sandboxes."""

AgentLink = tuple[AttachStream, AgentChannel]


async def attach_agent(
    api: DockerAPI, config: SandboxConfig, container_id: str, user: str, grant_args: list[str]
) -> AgentLink | None:
    """The agent attached in a container running as ``user``; None when the image cannot run it
    (the docker exec fallback applies).

    Raises:
        ImageUnusable: the image cannot run the agent and ``exec_fallback`` is off.
        SandboxError: the agent started but did not answer its first ping.
    """
    exec_id = await api.exec_create(
        container_id,
        # -I: no PYTHON* variables, user site-packages or script directory on sys.path, so
        # nothing a command left in the container (a usercustomize.py) runs in the agent.
        [config.agent_python, "-I", config.agent_path, "--root", WORKSPACE_ROOT, *grant_args],
        stdin=True,
        stdout=True,
        stderr=True,
        tty=False,
        user=user,
        workdir=WORKSPACE_ROOT,
    )
    sock, leftover = await api.exec_attach(exec_id)
    stream = await open_attach_stream(sock, leftover, exec_id)
    channel = AgentChannel(stream.reader, stream.writer, workspace_root=WORKSPACE_ROOT)
    try:
        version = await channel.ping(timeout=config.agent_start_timeout)
    except (SandboxError, ConnectionError) as exc:
        with contextlib.suppress(Exception):
            await channel.close()
        stream.close()
        info = await api.exec_inspect(exec_id)
        if not info.get("Running") and info.get("ExitCode") in _MISSING_EXECUTABLE:
            if not config.exec_fallback:
                raise ImageUnusable(
                    f"sandbox image {config.image!r} cannot run {config.agent_python!r} (exit "
                    f"{info.get('ExitCode')}): the agent needs python3 >= 3.9; {HOW_TO_BUILD}, "
                    "or set sandbox.exec_fallback: true to run shell through docker exec"
                ) from exc
            log.warning(
                "image %s cannot run the agent (%s); using docker exec for commands",
                config.image,
                stream.stderr_tail().decode(errors="replace").strip()[-200:],
            )
            return None
        tail = stream.stderr_tail().decode(errors="replace").strip()[-500:]
        raise SandboxError(f"the sandbox agent did not start: {exc}; stderr: {tail}") from exc
    if version != PROTOCOL_VERSION:
        # Every later op could fail as "unknown op" or worse; refuse the agent instead.
        with contextlib.suppress(Exception):
            await channel.close()
        stream.close()
        raise version_mismatch(config.image, version)
    return stream, channel


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


def has_ca(api: DockerAPI, container_id: str, mounted: bool | None) -> Callable[[], Awaitable[bool]]:
    """``open_tunnels``'s ``has_ca`` for a container (``mounted`` None: an adopted one, asked)."""
    return functools.partial(_has_ca, api, container_id, mounted)


async def _has_ca(api: DockerAPI, container_id: str, mounted: bool | None) -> bool:
    """Whether the CA bundle is there to name. Known for a container made here; asked of an
    adopted one (made by an earlier server, maybe before the tenant had a ``ca_bundle``):
    variables naming a missing file would break every TLS client in it, none break nothing
    that worked before. Nothing is remembered per container, so nothing is left to forget."""
    if mounted is not None:
        return mounted
    code, _ = await api.exec_run(container_id, ["test", "-f", CA_TARGET])
    if code != 0:
        log.warning(
            "container %s (adopted) has no CA bundle at %s: its commands are not told of one; "
            "it gets one when the session's sandbox is next recreated",
            container_id[:12],
            CA_TARGET,
        )
    return code == 0
