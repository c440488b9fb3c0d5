"""Starting the agent in a started container: the ``docker exec`` that runs it, its channel, its
first ping and protocol version, and the session's egress listener.

The agent is started with an attached ``docker exec`` (stdin/stdout/stderr, no tty). In a fresh
runc container it then connects to the server's socket mounted there (``listener.py``) and
speaks on it, skipping the daemon's relay. Otherwise it speaks on the exec's stdin/stdout; that
stream goes through the Docker daemon, so nothing in the sandbox can redirect it to a host path,
and it works under gVisor, which cannot reach host unix sockets by default. Used by ``ContainerLauncher``
(``launch.py``) for a session's container, by the warm pool (``pool/``) for one made before any
session, and after a restart for a re-adopted container.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.agent.protocol import CONNECT_FAILED, PROTOCOL_VERSION
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.config import CA_TARGET, WORKSPACE_ROOT, SandboxConfig, process_limit_args
from dispatcher.sandbox.container.host import AgentLink, AgentStream
from dispatcher.sandbox.container.image import HOW_TO_BUILD, ImageUnusable, version_mismatch
from dispatcher.sandbox.docker.agent.listener import AgentListener, AgentSockets
from dispatcher.sandbox.docker.agent.rejoin import rejoin
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.stream import READER_LIMIT, AttachStream, SocketStream, open_attach_stream

log = logging.getLogger(__name__)

_MISSING_EXECUTABLE = {126, 127}
_ALWAYS_FAILS = {CONNECT_FAILED, 2, *_MISSING_EXECUTABLE}
"""How an agent started with ``--connect`` ends when every later one would too: it cannot connect
there, predates the option (argparse's status), or cannot run at all."""


async def attach_agent(
    api: DockerAPI,
    config: SandboxConfig,
    container_id: str,
    user: str,
    grant_args: list[str],
    *,
    sockets: AgentSockets | None = None,
    listener: AgentListener | None = None,
) -> AgentLink | None:
    """The agent started in a container running as ``user``; None when the image cannot run it
    (the docker exec fallback applies). With a ``listener`` mounted in the container (a fresh runc
    one, ``listener.py``), it speaks over that socket; one that ends without connecting is
    attached through the daemon instead (see ``_connect_agent`` for when ``sockets`` is marked
    unusable).

    Raises:
        ImageUnusable: the image cannot run the agent and ``exec_fallback`` is off.
        SandboxError: the agent started but did not answer its first ping.
    """
    if listener is not None:
        try:
            link = await _connect_agent(api, config, container_id, user, grant_args, listener, sockets)
        finally:
            listener.close()
        if link is not None:
            return link
    return await _attach_agent(api, config, container_id, user, grant_args)


async def rejoin_agent(
    config: SandboxConfig, container_id: str, init_pid: int, user: str, grant_args: list[str]
) -> AgentLink | None:
    """The agent already waiting in a re-adopted container (whose init is ``init_pid``), given a
    channel by the server itself (``rejoin.py``); None when there is none to rejoin.

    Raises:
        SandboxError: it took the channel but did not answer its first ping.
    """
    joined = await rejoin(container_id, init_pid, user, _agent_argv(config, [])[:3], grant_args)
    if joined is None:
        return None
    return await _first_ping(config, *joined)


def _agent_argv(config: SandboxConfig, grant_args: list[str]) -> list[str]:
    # -I: no PYTHON* variables, user site-packages or script directory on sys.path, so
    # nothing a command left in the container (a usercustomize.py) runs in the agent.
    # --process-limits: the session's process table bounds, when not the agent's defaults.
    limits = process_limit_args(config.processes)
    return [config.agent_python, "-I", config.agent_path, "--root", WORKSPACE_ROOT, *grant_args, *limits]


async def _start_exec(api: DockerAPI, container_id: str, user: str, argv: list[str]) -> AttachStream:
    exec_id = await api.exec_create(
        container_id,
        argv,
        stdin=True,
        stdout=True,
        stderr=True,
        tty=False,
        user=user,
        workdir=WORKSPACE_ROOT,
    )
    sock, leftover = await api.exec_attach(exec_id)
    return await open_attach_stream(sock, leftover, exec_id)


async def _connect_agent(
    api: DockerAPI,
    config: SandboxConfig,
    container_id: str,
    user: str,
    grant_args: list[str],
    listener: AgentListener,
    sockets: AgentSockets | None,
) -> AgentLink | None:
    """The agent started with ``--connect``, its channel on the accepted socket; None when it
    ended without connecting (the caller attaches one through the daemon). If it ended as one
    always would here (it could not connect, does not know ``--connect``, or cannot run),
    ``sockets`` is marked unusable: later agents are attached at once."""
    argv = [*_agent_argv(config, grant_args), "--connect", listener.target]
    stream = await _start_exec(api, container_id, user, argv)
    ended = asyncio.ensure_future(_drain(stream.reader))
    try:
        async with asyncio.timeout(config.agent_start_timeout):
            conn = await listener.accept(_ExecPid(api, stream.exec_id), ended)
    except (TimeoutError, OSError, SandboxError) as exc:
        stream.close()
        tail = stream.stderr_tail().decode(errors="replace").strip()[-500:]
        reason = "it did not connect in time" if isinstance(exc, TimeoutError) else str(exc)
        raise SandboxError(f"the sandbox agent did not start: {reason}; stderr: {tail}") from exc
    except BaseException:  # cancelled (the server stops, the pool drains): nothing left open
        stream.close()
        raise
    finally:
        ended.cancel()
    if conn is None:
        stream.close()
        info = await api.exec_inspect(stream.exec_id)
        always = not info.get("Running") and info.get("ExitCode") in _ALWAYS_FAILS
        if always and sockets is not None:
            sockets.usable = False
        log.warning(
            "the sandbox agent could not use the server's socket (%s, exit %s); %s",
            stream.stderr_tail().decode(errors="replace").strip()[-300:] or "no message",
            info.get("ExitCode"),
            "agents are attached through the Docker daemon from now on"
            if always
            else "attaching this one through the Docker daemon",
        )
        return None
    try:
        reader, writer = await asyncio.open_unix_connection(sock=conn, limit=READER_LIMIT)
    except BaseException:
        conn.close()
        stream.close()
        raise
    direct = SocketStream(reader, writer, stream)
    return await _first_ping(config, direct, AgentChannel(reader, writer, workspace_root=WORKSPACE_ROOT))


class _ExecPid:
    """The exec's process in the host's pid namespace (0 before it started): asked of the daemon
    until it is known, then remembered, so a process that connects again and again (one left
    running in a re-adopted container) costs the daemon nothing."""

    def __init__(self, api: DockerAPI, exec_id: str) -> None:
        self._api = api
        self._exec_id = exec_id
        self._pid = 0

    async def __call__(self) -> int:
        if not self._pid:
            pid = (await self._api.exec_inspect(self._exec_id)).get("Pid")
            self._pid = pid if isinstance(pid, int) and pid > 0 else 0
        return self._pid


async def _drain(reader: asyncio.StreamReader) -> None:
    """Until the exec's stdout ends (its process exited); an agent on its socket writes none."""
    while await reader.read(1 << 16):
        pass


class AgentDidNotStart(SandboxError):
    """The agent did not answer its first ping (the stream and channel are closed)."""


async def _first_ping(config: SandboxConfig, stream: AgentStream, channel: AgentChannel) -> AgentLink:
    """``stream`` and ``channel`` once the agent answered with this server's protocol version.

    Raises:
        AgentDidNotStart: no answer.
        AgentVersionMismatch: another version.
    """
    try:
        version = await channel.ping(timeout=config.agent_start_timeout)
    except (SandboxError, ConnectionError) as exc:
        with contextlib.suppress(Exception):
            await channel.close()
        stream.close()
        tail = stream.stderr_tail().decode(errors="replace").strip()[-500:]
        raise AgentDidNotStart(f"the sandbox agent did not start: {exc}; stderr: {tail}") from exc
    except BaseException:  # cancelled while it started: its stream (and socket) closed with it
        stream.close()
        raise
    if version != PROTOCOL_VERSION:
        # Every later op could fail as "unknown op" or worse; refuse the agent instead.
        with contextlib.suppress(Exception):
            await channel.close()
        stream.close()
        raise version_mismatch(config.image, version)
    return stream, channel


async def _attach_agent(
    api: DockerAPI, config: SandboxConfig, container_id: str, user: str, grant_args: list[str]
) -> AgentLink | None:
    """The agent speaking on the attached exec's stdin/stdout."""
    stream = await _start_exec(api, container_id, user, _agent_argv(config, grant_args))
    try:
        return await _first_ping(
            config, stream, AgentChannel(stream.reader, stream.writer, workspace_root=WORKSPACE_ROOT)
        )
    except AgentDidNotStart as exc:
        info = await api.exec_inspect(stream.exec_id)
        if info.get("Running") or info.get("ExitCode") not in _MISSING_EXECUTABLE:
            raise
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
