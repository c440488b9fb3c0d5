"""Per-session Pods: launch slots and retries, re-adoption after a restart, orphans (making one
Pod: ``launch.py``; idle expiry: the provider base's, ``container/provider.py``).

``KubernetesSandboxProvider`` implements the core ``SandboxProvider`` and the ``ContainerHost`` of
``dispatcher.sandbox.container``, so a session's sandbox is the same ``ContainerSandbox``
(lifecycle, notices, enforcement, idle retirement) and its commands go through the same
``exec_guard`` as on Docker; only what a "container" is differs: a Pod (``manifests.py``) whose process is the agent, reached over ``pods/attach``
(``attach.py``). Its id is the Pod's name, which the session registry stores for re-adoption.

A Pod cannot be frozen: pausing a session has its agent stop (``SIGSTOP``) every process its
commands started, and resuming continue (``SIGCONT``) exactly those (the agent's ``pause`` op).

A Pod deleted behind the server's back (evicted, ``kubectl delete``) ends its attach stream: the
call in flight fails (or, if the agent had answered nothing, runs once more in a fresh Pod) and
the next call gets a new Pod, as for a vanished container. A command that outlives its kill
sequence gets its Pod deleted (grace 0).

After a restart, the stored Pod is re-adopted when its labels, its spec fingerprint and its phase
agree: the server attaches again to the same agent (its stdin stayed open, so unlike on Docker the
agent is the same one). A command that was running at the restart is not killed with its call: it
runs to its own timeout under the agent's kill sequence, and its late answers (request ids below the
new link's first) are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from dispatcher.core.provider_api import (
    NO_HOOKS,
    CopyBudget,
    ProviderHooks,
    SessionUsage,
    SnapshotUnsupported,
    UsageUnsupported,
)
from dispatcher.core.sandbox_api import (
    AttachedProcess,
    ExecRequest,
    ExecResult,
    FileOpError,
    OutputCallback,
    SandboxError,
)
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.channel import AgentChannel
from dispatcher.sandbox.container.adopt import GONE
from dispatcher.sandbox.container.config import SandboxConfig, format_size
from dispatcher.sandbox.container.host import ContainerNotFound, LiveContainer
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_SESSION
from dispatcher.sandbox.container.provider import ContainerProvider
from dispatcher.sandbox.kubernetes.api import KubeAPI
from dispatcher.sandbox.kubernetes.attach import ChannelStream
from dispatcher.sandbox.kubernetes.launch import PodLauncher
from dispatcher.sandbox.kubernetes.manifests import (
    label_value,
    network_policy_manifest,
)
from dispatcher.sandbox.kubernetes.pods import adoption_problem, created_at, pod_running

log = logging.getLogger(__name__)


NO_SNAPSHOTS = (
    "snapshots and forks are not available on the kubernetes backend: copying a session needs its"
    " workspace PVC cloned (a CSI driver with VolumeSnapshot support) and its /tmp copied out of"
    " the Pod, which this backend does not do; use the docker backend for them"
)


class KubernetesSandboxProvider(ContainerProvider):
    """Hands out one Pod-backed sandbox per session (implements ``SandboxProvider``)."""

    def __init__(
        self,
        config: SandboxConfig,
        kube: KubernetesConfig,
        *,
        instance: str,
        api: KubeAPI | None = None,
        hooks: ProviderHooks = NO_HOOKS,
    ) -> None:
        super().__init__(config, instance=instance, hooks=hooks)
        self.kube = kube
        self._api = api
        self._connecting = asyncio.Lock()
        self._channels: dict[str, AgentChannel] = {}
        """Each attached Pod's agent channel, by Pod name: what ``freeze`` and ``thaw`` talk to."""
        self.launcher = PodLauncher(
            config,
            kube,
            instance=self.instance,
            client=self.client,
            egress=lambda: self.egress,
            clock=lambda: self.clock(),
        )

    async def client(self) -> KubeAPI:
        """The API client, connected on first use (loading credentials is asynchronous)."""
        async with self._connecting:
            if self._api is None:
                self._api = await KubeAPI.connect(self.kube)
            return self._api

    # -- SandboxProvider -------------------------------------------------------------------

    async def close_session(self, session_id: str) -> None:
        """Delete the session's Pod (and any stray one with its labels); the workspace PVC stays."""
        sandbox = self._sandboxes.pop(session_id, None)
        if sandbox is not None:
            await sandbox.close()
        api = await self.client()
        labels = {LABEL_INSTANCE: label_value(self.instance), LABEL_SESSION: label_value(session_id)}
        for pod in await api.list_pods(labels):
            await api.delete_pod(pod["metadata"]["name"])

    async def aclose(self) -> None:
        """Delete every Pod this provider started and release the client."""
        self._closed = True
        await self.close_all()
        if self._api is not None:
            await self._api.aclose()

    # -- server start-up -------------------------------------------------------------------

    async def check_ready(self) -> None:
        """The API server answers and lets us list Pods in the namespace; the deny-all
        NetworkPolicy is there (made when missing, with ``kubernetes.network_policy``).

        Raises:
            SandboxError: unreachable, no credentials, or refused.
        """
        api = await self.client()
        await api.check_access()
        if self.kube.network_policy and await api.ensure_network_policy(
            network_policy_manifest(self.kube.namespace)
        ):
            log.info("created the deny-all NetworkPolicy in namespace %s", self.kube.namespace)

    async def remove_orphans(self, live_session_ids: Iterable[str] = ()) -> int:
        """Delete this instance's Pods that no live session owns; returns how many. A session
        expecting its Pod back (``expect_container``) keeps exactly that one if it can be adopted."""
        expected = {s.adopting: s for s in self._sandboxes.values() if s.adopting}
        adopting = {s.session.session_id for s in expected.values()}
        live = {label_value(i) for i in (set(live_session_ids) | set(self._sandboxes)) - adopting}
        owned = {s.container_id for s in self._sandboxes.values() if s.container_id}
        api = await self.client()
        removed = 0
        for pod in await api.list_pods({LABEL_INSTANCE: label_value(self.instance)}):
            name = pod["metadata"]["name"]
            labels = pod["metadata"].get("labels") or {}
            sandbox = expected.pop(name, None)
            if sandbox is not None:
                problem = adoption_problem(pod, sandbox.session, self.instance, self.config, self.kube)
                if problem is None:
                    sandbox.adoptable(created_at(pod))
                    continue
                sandbox.adoption_failed(problem)
            elif name in owned or labels.get(LABEL_SESSION) in live:
                continue
            if await api.delete_pod(name):
                removed += 1
        for sandbox in expected.values():
            sandbox.adoption_failed(GONE.replace("container", "pod"))
        if removed:
            log.info("deleted %d orphaned sandbox pod(s) of instance %s", removed, self.instance)
        # Only now is it settled which Pods stay: the CA bundles none of them mounts can go. A
        # Role from before configmaps were granted refuses: that costs a few stale objects, not
        # the start (a launch that needs a bundle says what it was refused).
        try:
            swept = await self.launcher.sweep_cas()
        except SandboxError as exc:
            log.warning("could not sweep unused egress CA configmaps: %s", exc)
        else:
            if swept:
                log.info("deleted %d unused egress CA configmap(s) of instance %s", swept, self.instance)
        return removed

    # -- ContainerHost ---------------------------------------------------------------------

    async def freeze(self, container_id: str) -> None:
        """A Pod cannot be frozen (Kubernetes has no pause): its agent stops (``SIGSTOP``) every
        process commands started instead; the agent itself keeps running. A Pod not attached
        (after a restart) is dealt with when it is (``start_agent``)."""
        await self._pause_processes(container_id, True)

    async def thaw(self, container_id: str) -> None:
        """Continue what ``freeze`` stopped. Raises ``ContainerNotFound`` when the Pod went
        meanwhile (handled as a vanished one)."""
        if await (await self.client()).get_pod(container_id) is None:
            raise ContainerNotFound(f"pod {container_id} is gone")
        await self._pause_processes(container_id, False)

    async def _pause_processes(self, container_id: str, paused: bool) -> None:
        channel = self._channels.get(container_id)
        if channel is None:
            return
        what = "stop" if paused else "continue"
        try:
            count = await asyncio.wait_for(channel.pause(paused), self.config.op_timeout_seconds)
        except (SandboxError, FileOpError, TimeoutError, ConnectionError) as exc:
            log.warning("pod %s: could not %s its processes: %s", container_id, what, exc)
            return
        done = "stopped" if paused else "continued"
        log.info("pod %s: %s %d process(es) of its session (paused: %s)", container_id, done, count, paused)

    async def usage(self, session: Session) -> SessionUsage:
        """Not measured on Kubernetes: the API server itself serves no container's CPU or memory.

        Raises:
            UsageUnsupported: always, saying what it would take.
        """
        raise UsageUnsupported(
            "usage per session is not available on the kubernetes backend: it needs the cluster's"
            " metrics API (metrics.k8s.io, from metrics-server), which this server does not read;"
            " use `kubectl top pod` with the session's labels meanwhile"
        )

    async def capture(
        self,
        session: Session,
        tmp_dest: str,
        copy_workspace: Callable[[], Awaitable[None]],
        budget: CopyBudget,
    ) -> bool:
        """Not on Kubernetes yet.

        Raises:
            SnapshotUnsupported: always, saying what it would take.
        """
        raise SnapshotUnsupported(NO_SNAPSHOTS)

    async def seed_tmp(self, session: Session, source: str) -> None:
        raise SnapshotUnsupported(NO_SNAPSHOTS)

    def quota_note(self, tenant_id: str) -> str | None:
        quota = self.config.workspace_quota
        if not quota:
            return None
        return f"the workspace's volume of {format_size(quota)} (sandbox.workspace_quota) is full"

    async def launch(self, session: Session) -> LiveContainer:
        """A new running Pod for the session, its agent attached (one retry, as on Docker).

        Raises:
            SandboxError: the Pod could not be created, did not run, or its agent did not answer.
        """
        live = await self._launch_counted(functools.partial(self.launcher.launch_once, session))
        if live.channel is not None:
            self._channels[live.container_id] = live.channel
        return live

    async def start_agent(self, container_id: str, session: Session) -> tuple[ChannelStream, AgentChannel]:
        """Attach to the Pod's agent (see ``PodLauncher.start_agent``).

        Raises:
            SandboxError: the attach was refused or the agent did not answer its ping.
        """
        stream, channel = await self.launcher.start_agent(container_id, session)
        self._channels[container_id] = channel
        # Its processes may have been stopped by a pause before the restart: the session says
        # whether they stay so (a paused session) or continue.
        sandbox = self._sandboxes.get(session.session_id)
        await self._pause_processes(container_id, sandbox is not None and sandbox.paused)
        return stream, channel

    async def destroy(self, live: LiveContainer) -> None:
        """Close the agent channel and delete the Pod now (grace 0); failures are logged."""
        self._channels.pop(live.container_id, None)
        if live.channel is not None:
            with contextlib.suppress(Exception):
                await live.channel.close()
        if live.stream is not None:
            live.stream.close()
        try:
            await (await self.client()).delete_pod(live.container_id)
        except SandboxError as exc:
            log.warning("could not delete pod %s: %s", live.container_id, exc)

    async def is_running(self, container_id: str) -> bool:
        try:
            return pod_running(await (await self.client()).get_pod(container_id))
        except SandboxError:
            return False

    async def remove_container(self, container_id: str) -> None:
        self._channels.pop(container_id, None)
        await (await self.client()).delete_pod(container_id)

    async def exec_without_agent(
        self,
        live: LiveContainer,
        session: Session,
        request: ExecRequest,
        on_output: OutputCallback,
        cancel_event: asyncio.Event,
        enforce: Callable[[str], Awaitable[None]],
    ) -> ExecResult:
        """A Pod's process is its agent: there is no command without it."""
        raise SandboxError("the sandbox has no agent to run the command")

    async def start_process(
        self,
        live: LiveContainer,
        session: Session,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        limit: int,
    ) -> AttachedProcess:
        """Not on a cluster: the agent speaks over the Pod's one attach stream."""
        raise SandboxError("MCP servers with run: sandbox need the docker sandbox backend")


__all__ = ["KubernetesSandboxProvider"]
