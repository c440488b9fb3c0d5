"""Per-session Docker containers: creation, the agent's attach channel, orphans, idle expiry.

``DockerSandboxProvider`` implements the core ``SandboxProvider``. Each session gets one container,
created on its first sandboxed call, with the workspace bind-mounted at ``/workspace`` and labelled
with the session, tenant and server instance. The agent is started with an attached
``docker exec`` (stdin/stdout/stderr, no tty); its stream goes through the Docker daemon, so
nothing in the sandbox can redirect it to a host path, and it works under gVisor, which cannot
reach host unix sockets by default.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
import time
from collections.abc import Iterable
from typing import Any

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.session import Session
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.docker_client import DockerAPI
from dispatcher.sandbox.docker_config import (
    LABEL_INSTANCE,
    LABEL_SESSION,
    LABEL_TENANT,
    WORKSPACE_ROOT,
    SandboxConfig,
)
from dispatcher.sandbox.docker_sandbox import DockerSandbox, LiveContainer
from dispatcher.sandbox.docker_stream import AttachStream, open_attach_stream

log = logging.getLogger(__name__)

_NAME_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]+")
_MISSING_EXECUTABLE = {126, 127}


def instance_id_for(state_dir: str) -> str:
    """A stable id for the server installation that keeps its state in ``state_dir``."""
    real = os.path.realpath(os.path.expanduser(state_dir))
    return hashlib.sha256(real.encode()).hexdigest()[:16]


class DockerSandboxProvider:
    """Hands out one Docker-backed sandbox per session (implements ``SandboxProvider``)."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        instance: str,
        api: DockerAPI | None = None,
    ) -> None:
        self.config = config or SandboxConfig()
        self.instance = self.config.instance or instance
        if not self.instance:
            raise ValueError("instance must be a non-empty string")
        self.api = api or DockerAPI()
        self._sandboxes: dict[str, DockerSandbox] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        # A burst of new sessions on a small machine: launching them all at once makes every agent
        # miss its start deadline; a few at a time makes each one fast.
        self._launch_slots = asyncio.Semaphore(self.config.max_concurrent_launches)

    # -- SandboxProvider -----------------------------------------------------------------

    def sandbox_for(self, session: Session) -> DockerSandbox:
        """The session's sandbox handle; no container exists until its first call."""
        if self._closed:
            raise SandboxError("the sandbox provider is closed")
        sandbox = self._sandboxes.get(session.session_id)
        if sandbox is None:
            sandbox = self._sandboxes[session.session_id] = DockerSandbox(self, session)
        self._ensure_reaper()
        return sandbox

    async def close_session(self, session_id: str) -> None:
        """Remove the session's container (and any stray one with its labels); the workspace stays."""
        sandbox = self._sandboxes.pop(session_id, None)
        if sandbox is not None:
            await sandbox.close()
        for container in await self.api.list_by_labels(self._labels(session_id=session_id)):
            await self.api.remove(container["Id"])

    async def aclose(self) -> None:
        """Remove every container this provider started and release the Docker client."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        sandboxes, self._sandboxes = list(self._sandboxes.values()), {}
        results = await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("closing a sandbox failed: %s", result)
        await self.api.aclose()

    # -- server start-up -----------------------------------------------------------------

    async def check_ready(self) -> None:
        """Fail early and clearly when the daemon or the image is missing.

        Raises:
            SandboxError: no daemon answers, or the image is not built.
        """
        if not await self.api.ping():
            raise SandboxError("no Docker daemon answers (see scripts/ensure-docker.sh)")
        if not await self.api.image_exists(self.config.image):
            raise SandboxError(f"sandbox image {self.config.image!r} is missing (run `make images`)")

    async def remove_orphans(self, live_session_ids: Iterable[str] = ()) -> int:
        """Remove this instance's containers that no live session owns; returns how many."""
        # Every session with a handle counts as live, even one whose container is being created.
        live = set(live_session_ids) | set(self._sandboxes)
        owned = {s.container_id for s in self._sandboxes.values() if s.container_id}
        removed = 0
        for container in await self.api.list_by_labels({LABEL_INSTANCE: self.instance}):
            labels = container.get("Labels") or {}
            if container["Id"] in owned or labels.get(LABEL_SESSION) in live:
                continue
            if await self.api.remove(container["Id"]):
                removed += 1
        if removed:
            log.info("removed %d orphaned sandbox container(s) of instance %s", removed, self.instance)
        return removed

    # -- used by DockerSandbox -----------------------------------------------------------

    async def launch(self, session: Session) -> LiveContainer:
        """Create and start the session's container, then attach the agent (or fall back).

        Raises:
            SandboxError: the container could not be created or started.
        """
        async with self._launch_slots:
            try:
                link, container_id = await self._launch_once(session)
            except SandboxError as exc:
                # Nothing has run in the sandbox yet, so one more try is safe.
                log.warning("sandbox launch failed, retrying once: %s", exc)
                link, container_id = await self._launch_once(session)
        if link is None:
            return LiveContainer(container_id, None, None)
        return LiveContainer(container_id, link[0], link[1])

    async def _launch_once(self, session: Session) -> tuple[tuple[AttachStream, AgentChannel] | None, str]:
        container_id = await self._create_container(session)
        try:
            await self.api.start(container_id)
            return await self._start_agent(container_id), container_id
        except BaseException:
            with contextlib.suppress(Exception):
                await self.api.remove(container_id)
            raise

    async def destroy(self, live: LiveContainer) -> None:
        """Close the agent channel and remove the container; failures are logged, not raised."""
        if live.channel is not None:
            with contextlib.suppress(Exception):
                await live.channel.close()
        if live.stream is not None:
            live.stream.close()
        try:
            await self.api.remove(live.container_id)
        except SandboxError as exc:
            # remove_orphans() on the next start catches what this could not remove.
            log.warning("could not remove container %s: %s", live.container_id[:12], exc)

    # -- internals -----------------------------------------------------------------------

    def _labels(self, session_id: str | None = None, tenant_id: str | None = None) -> dict[str, str | None]:
        labels: dict[str, str | None] = {LABEL_INSTANCE: self.instance}
        if session_id is not None:
            labels[LABEL_SESSION] = session_id
        if tenant_id is not None:
            labels[LABEL_TENANT] = tenant_id
        return labels

    def _container_spec(self, session: Session) -> dict[str, Any]:
        cfg = self.config
        labels = {**cfg.extra_labels, LABEL_INSTANCE: self.instance}
        labels[LABEL_SESSION] = session.session_id
        labels[LABEL_TENANT] = session.tenant_id
        exec_flag = "exec" if cfg.tmp_exec else "noexec"
        host_config: dict[str, Any] = {
            "mounts": [{"Type": "bind", "Source": session.workspace_path, "Target": WORKSPACE_ROOT}],
            "network_mode": cfg.network_mode,
            "cap_drop": list(cfg.cap_drop),
            "cap_add": list(cfg.cap_add) or None,
            "security_opt": ["no-new-privileges:true"] if cfg.no_new_privileges else None,
            "read_only": cfg.read_only,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,{exec_flag},size={cfg.tmpfs_size},mode=1777"},
            "pids_limit": cfg.pids_limit,
            "mem_limit": cfg.mem_limit,
            "memswap_limit": cfg.mem_limit,  # equal: no swap to hide a memory bomb in
            "nano_cpus": cfg.nano_cpus,
            "init": cfg.init,
            "runtime": cfg.runtime,
            "ipc_mode": "private",
        }
        return {
            "image": cfg.image,
            # The container only has to stay up; commands come through the agent or docker exec.
            "command": ["sleep", "2147483647"],
            "user": cfg.user,
            "working_dir": WORKSPACE_ROOT,
            "labels": labels,
            "hostname": "sandbox",
            "network_disabled": cfg.network_mode == "none",
            "host_config": host_config,
        }

    async def _create_container(self, session: Session) -> str:
        await asyncio.get_running_loop().run_in_executor(None, self._prepare_workspace, session)
        spec = self._container_spec(session)
        name = "-".join(
            (
                "dispatcher",
                self.instance[:12],
                _NAME_UNSAFE.sub("_", session.session_id)[:40],
                secrets.token_hex(3),
            )
        )
        return await self.api.create_container(name, spec)

    def _prepare_workspace(self, session: Session) -> None:
        """Make sure the workspace exists and the sandbox user may write to it (blocking)."""
        path = os.path.realpath(session.workspace_path)
        os.makedirs(path, exist_ok=True)
        uid, gid = self.config.uid, self.config.gid
        if not self.config.chown_workspace or uid is None or os.geteuid() != 0:
            return
        st = os.stat(path)
        # Only the top directory: the sandbox user owns its workspace; files the host put there
        # keep their owner, as the host user intended.
        if st.st_uid != uid or (gid is not None and st.st_gid != gid):
            os.chown(path, uid, gid if gid is not None else -1)

    async def _start_agent(self, container_id: str) -> tuple[AttachStream, AgentChannel] | None:
        """Attach the agent; None when the image cannot run it (the docker exec fallback applies).

        Raises:
            SandboxError: the agent started but did not answer its first ping.
        """
        cfg = self.config
        exec_id = await self.api.exec_create(
            container_id,
            [cfg.agent_python, cfg.agent_path, "--root", WORKSPACE_ROOT],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            user=cfg.user,
            workdir=WORKSPACE_ROOT,
        )
        sock, leftover = await self.api.exec_attach(exec_id)
        stream = await open_attach_stream(sock, leftover, exec_id)
        channel = AgentChannel(stream.reader, stream.writer, workspace_root=WORKSPACE_ROOT)
        try:
            await channel.ping(timeout=cfg.agent_start_timeout)
        except (SandboxError, ConnectionError) as exc:
            with contextlib.suppress(Exception):
                await channel.close()
            stream.close()
            info = await self.api.exec_inspect(exec_id)
            if not info.get("Running") and info.get("ExitCode") in _MISSING_EXECUTABLE:
                log.warning(
                    "image %s cannot run the agent (%s); using docker exec for commands",
                    cfg.image,
                    stream.stderr_tail().decode(errors="replace").strip()[-200:],
                )
                return None
            tail = stream.stderr_tail().decode(errors="replace").strip()[-500:]
            raise SandboxError(f"the sandbox agent did not start: {exc}; stderr: {tail}") from exc
        return stream, channel

    def _ensure_reaper(self) -> None:
        if self._reaper is not None and not self._reaper.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # sandbox_for() called outside a loop; the first async call starts it
        self._reaper = loop.create_task(self._reap_idle(), name="sandbox-idle-reaper")

    async def _reap_idle(self) -> None:
        ttl = self.config.idle_ttl_seconds
        interval = min(max(ttl / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for sandbox in list(self._sandboxes.values()):
                try:
                    await sandbox.retire_if_idle(now, ttl)
                except Exception as exc:  # one failing removal must not stop the reaper
                    log.warning("idle removal of session %s failed: %s", sandbox.session.session_id, exc)
