"""Per-session Docker containers: launch slots and retries, re-adoption, quotas (the start-up sweep
of orphans: ``orphans.py``; container deaths: ``watch.py``; what every container host shares, the
idle reaper included: ``dispatcher.sandbox.container``).

``DockerSandboxProvider`` implements the core ``SandboxProvider`` and the ``ContainerHost`` of its
sessions' ``ContainerSandbox``, with what only Docker offers: commands through plain ``docker exec``
for an image that cannot run the agent (``fallback.py``) and processes with their stdio attached
(``stdio.py``). Each session gets one container,
created on its first sandboxed call (by ``ContainerLauncher``, ``launch.py``), with the workspace
bind-mounted at ``/workspace`` and labelled with the session, tenant and server instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dispatcher.core.provider_api import (
    NO_HOOKS,
    CopyBudget,
    ProviderHooks,
    SessionUsage,
    SnapshotUnsupported,
)
from dispatcher.core.sandbox_api import AttachedProcess, ExecRequest, ExecResult, OutputCallback, SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig, format_size
from dispatcher.sandbox.container.host import AgentLink, ContainerNotFound, LiveContainer
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_SESSION, LABEL_TENANT
from dispatcher.sandbox.container.provider import ContainerProvider
from dispatcher.sandbox.docker.agent.attach import rejoin_agent
from dispatcher.sandbox.docker.agent.listener import LABEL_AGENT_LINK
from dispatcher.sandbox.docker.client import DockerAPI
from dispatcher.sandbox.docker.fallback import fallback_exec
from dispatcher.sandbox.docker.image_check import check_image
from dispatcher.sandbox.docker.launch import NAME_UNSAFE, ContainerLauncher
from dispatcher.sandbox.docker.orphans import sweep_orphans
from dispatcher.sandbox.docker.pool.adopt import readopt
from dispatcher.sandbox.docker.pool.warm_pool import WarmPool
from dispatcher.sandbox.docker.stdio import DockerStdioProcess
from dispatcher.sandbox.docker.tmp_copy import copy_in, copy_out
from dispatcher.sandbox.docker.usage import from_stats, workspace_bytes
from dispatcher.sandbox.docker.watch import DeathWatch, still_running
from dispatcher.sandbox.docker.workspace_volume import WorkspaceVolumes
from dispatcher.sandbox.tree_copy import TreeTooDeep, run_copy

if TYPE_CHECKING:
    from dispatcher.core.sessions.registry import Restoration
    from dispatcher.core.sessions.state import SessionState

log = logging.getLogger(__name__)


def instance_id_for(state_dir: str) -> str:
    """A stable id for the server installation that keeps its state in ``state_dir``."""
    real = os.path.realpath(os.path.expanduser(state_dir))
    return hashlib.sha256(real.encode()).hexdigest()[:16]


class DockerSandboxProvider(ContainerProvider):
    """Hands out one Docker-backed sandbox per session (implements ``SandboxProvider``)."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        instance: str,
        api: DockerAPI | None = None,
        state_dir: str | None = None,
        hooks: ProviderHooks = NO_HOOKS,
    ) -> None:
        super().__init__(config or SandboxConfig(), instance=instance, hooks=hooks)
        self.api = api or DockerAPI()
        state = os.path.abspath(os.path.expanduser(state_dir)) if state_dir else None
        # Staging mounts live where only the server can write: its state dir, or /run as root.
        self._run_dir = (
            os.path.join(state, "run", "mounts")
            if state
            else os.path.join("/run/dispatcher", NAME_UNSAFE.sub("_", self.instance), "mounts")
        )
        self.launcher = ContainerLauncher(
            self.config,
            instance=self.instance,
            api=self.api,
            run_dir=self._run_dir,
            egress=lambda: self.egress,
        )
        self.volumes = WorkspaceVolumes(
            self.config.workspace_quota,
            os.path.join(state, "volumes") if state else None,
            mode=self.config.workspace_quota_mode,
        )
        self._watcher: asyncio.Task[None] | None = None
        self._deaths = DeathWatch(
            self.api,
            self.instance,
            sandboxes=lambda: list(self._sandboxes.values()),
            closed=lambda: self._closed,
        )
        """Containers Docker reports dead."""
        self.pool = WarmPool(
            self.launcher,
            self.api,
            os.path.join(os.path.dirname(self._run_dir), "pool"),
            launch_slots=self._launch_slots,
            observer=lambda: self.observer,
        )
        """Containers made ahead of sessions (``sandbox.warm_pool``); a session adopts one."""

    # -- SandboxProvider -----------------------------------------------------------------

    def _watch(self) -> None:
        """The idle reaper and, once, the watch over container deaths."""
        super()._watch()
        self._deaths.start()

    def expect_tenants(self, tenants: Mapping[str, tuple[int | None, int | None]]) -> None:
        """The warm pool is shared among these tenants until their sessions say otherwise."""
        self.pool.expect_tenants(tenants)

    def reserve_session_id(self, session: Session) -> str | None:
        """With ``start_on_create``, the id of a warm pool's container for the new session (made
        with its labels): the session adopts it as it starts (``pool/``)."""
        if not self.config.start_on_create or self._closed:
            return None  # a reserved container would wait for the first call, unused
        return self.pool.reserve(session)

    def release_session_id(self, session_id: str) -> None:
        self.pool.release(session_id)

    async def usage(self, session: Session) -> SessionUsage:
        """The container's cgroup counters (none running: zeros) and the workspace's bytes on disk.

        Raises:
            SandboxError: the daemon did not answer.
        """
        sandbox = self._sandboxes.get(session.session_id)
        container_id = None if sandbox is None else sandbox.container_id or sandbox.adopting
        used = SessionUsage(sample_time=time.time())
        if container_id is not None:
            with contextlib.suppress(ContainerNotFound):  # gone since: the next call starts another
                used = from_stats(await self.api.stats(container_id))
        disk = await asyncio.get_running_loop().run_in_executor(None, workspace_bytes, session.workspace_path)
        return dataclasses.replace(used, disk_bytes=disk, disk_limit_bytes=self.config.workspace_quota or 0)

    async def capture(
        self,
        session: Session,
        tmp_dest: str,
        copy_workspace: Callable[[], Awaitable[None]],
        budget: CopyBudget,
    ) -> bool:
        """Freeze the session's container (unless paused), copy its ``/tmp`` from the host
        (``tmp_copy.py``) charging ``budget``, run ``copy_workspace``, thaw it.

        Raises:
            SnapshotUnsupported: the container runs under gVisor (its /tmp is in the sandbox's own
                kernel, out of the host's reach).
            CopyBudgetExceeded: the copy would pass ``budget``.
            SandboxError: the container or the copy failed.
        """
        self._check_copyable()
        sandbox = self.sandbox_for(session)
        async with sandbox.held_still() as container_id:
            pid = await self._pid(container_id) if container_id is not None else 0
            if pid:
                try:
                    await run_copy(budget, functools.partial(copy_out, pid, tmp_dest, budget))
                except OSError as exc:
                    raise SandboxError(f"copying the session's /tmp failed: {exc}") from exc
            await copy_workspace()
        return bool(pid)

    async def seed_tmp(self, session: Session, source: str) -> None:
        """Launch the session's container now and copy ``source`` into its ``/tmp``, before the
        session's first command (the container is the session's alone: nothing of it ran yet).

        Raises:
            SnapshotUnsupported: under gVisor (see ``capture``).
            SandboxError: the launch or the copy failed.
        """
        self._check_copyable()
        async with self.sandbox_for(session).using() as live:
            pid = await self._pid(live.container_id)
            if not pid:
                raise SandboxError("the session's new container is not running")
            try:
                await asyncio.get_running_loop().run_in_executor(None, copy_in, source, pid)
            except (OSError, TreeTooDeep) as exc:
                raise SandboxError(f"copying /tmp into the session's container failed: {exc}") from exc

    def _check_copyable(self) -> None:
        if self.config.runtime == "runsc":
            raise SnapshotUnsupported(
                "snapshots and forks need runc: under gVisor (sandbox.runtime: runsc) a container's"
                " /tmp lives in the sandbox's own kernel, which the host cannot copy"
            )

    async def _pid(self, container_id: str) -> int:
        state = (await self.api.inspect(container_id)).get("State") or {}
        return int(state.get("Pid") or 0)

    async def close_session(self, session_id: str) -> None:
        """Remove the session's container (and any stray one with its labels); the workspace stays."""
        self.pool.release(session_id)  # reserved and not yet taken: removed, never pooled again
        sandbox = self._sandboxes.pop(session_id, None)
        if sandbox is not None:
            await sandbox.close()
        for container in await self.api.list_by_labels(self._labels(session_id=session_id)):
            await self.remove_container(container["Id"])  # with its socket directory and pool slot

    async def aclose(self) -> None:
        """Remove every container this provider started, unmount its volumes, release the client."""
        self._closed = True
        await self.pool.aclose()
        self._deaths.close()
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        await self.close_all()
        # Kept containers hold their own mounts of a volume; the next start mounts the same loop
        # device again (``attached_loop``), never a second one.
        await asyncio.get_running_loop().run_in_executor(None, self.volumes.release)
        self.launcher.sockets.close()
        for empty in (self._run_dir, os.path.dirname(self._run_dir)):
            with contextlib.suppress(OSError):
                os.rmdir(empty)  # only when empty: nothing is staged any more
        await self.api.aclose()

    # -- server start-up -----------------------------------------------------------------

    async def check_ready(self) -> None:
        """Fail early and clearly when the daemon or the image is missing.

        Raises:
            SandboxError: no daemon answers, or the image is not built.
            ImageUnusable: the image lacks python or the agent, its agent speaks another
                protocol version, or its USER is root (the message says how to build it).
        """
        if not await self.api.ping():
            raise SandboxError("no Docker daemon answers (see scripts/ensure-docker.sh)")
        if not await self.api.image_exists(self.config.image):
            raise SandboxError(f"sandbox image {self.config.image!r} is missing (run `make images`)")
        for warning in await check_image(self.api, self.config, instance=self.instance):
            log.warning("%s", warning)

    async def prepare_tenants(self, roots: Mapping[str, str]) -> None:
        """Put each tenant's workspace root (tenant id -> path) under its disk quota, before any
        workspace is created there; says at start what is enforced how.

        Raises:
            SandboxError: a quota image could not be made or mounted.
        """
        loop = asyncio.get_running_loop()
        for tenant_id, root in roots.items():
            await loop.run_in_executor(None, self.volumes.prepare, tenant_id, root)
        watched = any(v.enforcement == "watch" for v in self.volumes.tenants.values())
        if watched and self._watcher is None:
            self._watcher = loop.create_task(self._watch_usage(), name="workspace-usage-watcher")

    async def scan_usage(self) -> list[str]:
        """Measure the watched tenants now; remove the sandboxes of those over quota (returned)."""
        over = await asyncio.get_running_loop().run_in_executor(None, self.volumes.scan)
        for sandbox in list(self._sandboxes.values()):
            if sandbox.session.tenant_id in over:
                await sandbox.stop_for(f"tenant {sandbox.session.tenant_id!r} is over its workspace quota")
        return over

    def quota_note(self, tenant_id: str) -> str | None:
        """How the tenant's disk is bounded, for an ENOSPC message; None without a quota."""
        volume = self.volumes.tenants.get(tenant_id)
        quota = self.config.workspace_quota
        if volume is None or volume.enforcement == "off" or not quota:
            return None
        return f"the tenant's workspace quota of {format_size(quota)} (sandbox.workspace_quota) is full"

    async def remove_orphans(self, live_session_ids: Iterable[str] = ()) -> int:
        """Remove this instance's containers that no live session owns; returns how many.

        A session expecting to re-adopt a container (``expect_container``) keeps exactly that
        one, if its labels match and it runs; otherwise it learns why it will get a fresh one.
        """
        sockets = self.launcher.sockets
        removed = await sweep_orphans(
            self.api,
            self.instance,
            self.config,
            self._sandboxes,
            live_session_ids,
            pooled=self.pool.owns,
            kept=self._kept,
            gone=sockets.forget,
        )
        # Listener directories of containers removed while no server ran (the sweep's included).
        await asyncio.get_running_loop().run_in_executor(None, sockets.sweep)
        # Filled only now: this start-up sweep removes the previous run's pooled containers.
        self.pool.start()
        return removed

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        """Re-adopt its container; with none stored, one its labels name (``orphans.py``)."""
        super().session_restored(state, restored)
        if not restored.container_id:
            self.sandbox_for(state.session).expect_labelled()

    def _kept(self, container: Mapping[str, Any]) -> None:
        """The start-up sweep kept this container (as listed): its agent's socket directory, and a
        pooled one's slot, stay with it."""
        self.launcher.sockets.known(container["Id"], (container.get("Labels") or {}).get(LABEL_AGENT_LINK))
        self.pool.kept(container)

    # -- ContainerHost: after a restart, pause, enforcement -------------------------------

    async def freeze(self, container_id: str) -> None:
        await self.api.pause(container_id)

    async def thaw(self, container_id: str) -> None:
        await self.api.unpause(container_id)

    async def is_running(self, container_id: str) -> bool:
        return await still_running(self.api, container_id)

    async def remove_container(self, container_id: str) -> None:
        await self.api.remove(container_id)
        self.launcher.sockets.forget(container_id)
        await self.pool.removed(container_id)  # a pooled one's slot goes with it

    # -- ContainerHost: used by ContainerSandbox ----------------------------------------

    async def launch(self, session: Session) -> LiveContainer:
        """Create and start the session's container, then attach the agent (or fall back).

        Raises:
            SandboxError: the container could not be created or started.
        """
        self.volumes.check(session.tenant_id)
        if self.pool.usable_for(session):
            pooled = await self.pool.take(session)
            if pooled is not None:
                stream, channel = pooled.link
                return LiveContainer(pooled.container_id, stream, channel, started=self.clock())
        link, container_id = await self._launch_counted(functools.partial(self.launcher.launch_once, session))
        if link is None:
            return LiveContainer(container_id, None, None, started=self.clock())
        return LiveContainer(container_id, link[0], link[1], started=self.clock())

    async def start_agent(self, container_id: str, session: Session) -> AgentLink | None:
        """Start an agent in a running container (adoption after a restart): on the socket its
        listener directory holds, if it has one (``agent/listener.py``); see ``ContainerLauncher``."""
        pid = await self.launcher.running_pid(container_id)
        if self.pool.readopting(container_id):
            return await self._restart_pooled(container_id, session, pid)
        # Checked as the pool's are (``pool/adopt.py``), before any agent serves it.
        await self.launcher.confirm_view(container_id, session, pid=pid)
        if pid is not None and (link := await self.launcher.rejoin_agent(container_id, session, pid)):
            return link
        listener = self.launcher.sockets.relisten(container_id)
        try:
            return await self.launcher.start_agent(container_id, session, listener=listener)
        finally:
            if listener is not None:
                listener.close()

    async def _restart_pooled(self, container_id: str, session: Session, pid: int | None) -> AgentLink:
        """A pooled container's agent (the one waiting in it, or a new one), once it sees the
        session's workspace (``pool/adopt.py``)."""
        user = self.config.user_for(session.sandbox_uid, session.sandbox_gid)
        link = await rejoin_agent(self.config, container_id, pid, user, []) if pid is not None else None
        if link is None:
            listener = self.launcher.sockets.relisten(container_id)
            try:
                link = await self.launcher.attach_agent(container_id, user, [], listener=listener)
            finally:
                if listener is not None:
                    listener.close()
        if link is None:
            raise SandboxError("a warm pool's container whose agent cannot run is not re-adopted")
        try:
            await readopt(self.launcher, session, container_id=container_id, link=link)
        except BaseException:
            with contextlib.suppress(Exception):
                await link[1].close()
            link[0].close()
            raise
        return link

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
            return
        self.launcher.sockets.forget(live.container_id)
        await self.pool.removed(live.container_id)  # an adopted one's slot goes with it

    async def exec_without_agent(
        self,
        live: LiveContainer,
        session: Session,
        request: ExecRequest,
        on_output: OutputCallback,
        cancel_event: asyncio.Event,
        enforce: Callable[[str], Awaitable[None]],
    ) -> ExecResult:
        """An image that cannot run the agent: the command through plain ``docker exec``."""
        user = self.config.user_for(session.sandbox_uid, session.sandbox_gid)
        return await fallback_exec(
            self.api, live.container_id, user, request, on_output, cancel_event, enforce
        )

    async def start_process(
        self,
        live: LiveContainer,
        session: Session,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        limit: int,
    ) -> AttachedProcess:
        """A process in the container, its stdio attached over ``docker exec`` (``stdio.py``)."""
        user = self.config.user_for(session.sandbox_uid, session.sandbox_gid)
        return await DockerStdioProcess.start(self.api, live.container_id, user, argv, env, limit=limit)

    # -- internals -----------------------------------------------------------------------

    def _labels(self, session_id: str | None = None, tenant_id: str | None = None) -> dict[str, str | None]:
        labels: dict[str, str | None] = {LABEL_INSTANCE: self.instance}
        if session_id is not None:
            labels[LABEL_SESSION] = session_id
        if tenant_id is not None:
            labels[LABEL_TENANT] = tenant_id
        return labels

    async def _watch_usage(self) -> None:
        while True:
            await asyncio.sleep(self.config.workspace_watch_interval_seconds)
            try:
                await self.scan_usage()
            except Exception as exc:  # one failed scan must not stop the watcher
                log.warning("measuring workspace usage failed: %s", exc)
