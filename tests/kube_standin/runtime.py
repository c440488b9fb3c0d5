"""Pods as Docker containers: launch, phase from the container's state, graceful deletion.

One thread follows the daemon's event stream for this server's containers (label
``kube-standin.instance``) and posts each state change to the event loop, which writes it into the
Pod's status; no thread is held per Pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
from pathlib import Path
from typing import Any

import docker
import docker.errors

from tests.kube_standin.configmaps import files, write_volume
from tests.kube_standin.podspec import ContainerPlan, Obj, plan_container, pod_dir, prepare_host_dir, pvc_dir
from tests.kube_standin.selectors import parse_selector
from tests.kube_standin.status import ApiError
from tests.kube_standin.store import CONFIGMAP, POD, PVC, Store, now

LABEL_INSTANCE = "kube-standin.instance"
"""Every container the stand-in makes carries it: a test teardown removes them all by it."""
LABEL_POD = "kube-standin.pod"
LABEL_UID = "kube-standin.uid"


def _waiting(reason: str, message: str = "") -> Obj:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def _set_container_status(
    pod: Obj, state: Obj, *, ready: bool, container_id: str = "", restarts: int = 0
) -> None:
    container = pod["spec"]["containers"][0]
    status: Obj = {
        "name": container["name"],
        "image": container["image"],
        "imageID": "",
        "ready": ready,
        "started": "running" in state,
        "restartCount": restarts,
        "state": state,
    }
    if container_id:
        status["containerID"] = f"docker://{container_id}"
    pod.setdefault("status", {})["containerStatuses"] = [status]
    pod["status"]["conditions"] = [
        {"type": t, "status": "True" if ok else "False", "lastTransitionTime": now()}
        for t, ok in (
            ("PodScheduled", True),
            ("Initialized", True),
            ("ContainersReady", ready),
            ("Ready", ready),
        )
    ]


def initial_status(pod: Obj) -> None:
    """A new Pod: Pending, its container being created."""
    pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "hostIP": "127.0.0.1", "startTime": now()}
    _set_container_status(pod, _waiting("ContainerCreating"), ready=False)


class PodRuntime:
    """Starts, follows and removes the containers that stand in for Pods."""

    def __init__(
        self, store: Store, client: docker.DockerClient, *, instance: str, state_dir: Path, pids_limit: int
    ) -> None:
        self.store = store
        self.client = client
        self.instance = instance
        self.state_dir = state_dir
        self.pids_limit = pids_limit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: Any = None
        self._events_client: docker.DockerClient | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._mount_waits: dict[str, asyncio.Future[Any]] = {}
        """Pods (by uid) waiting for a ConfigMap to mount: their deletion ends the wait."""

    # -- lifecycle of the runtime itself ---------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Its own client: the events thread must not share the handlers' HTTP session.
        self._events_client = docker.from_env()
        self._events = self._events_client.events(
            decode=True, filters={"type": "container", "label": f"{LABEL_INSTANCE}={self.instance}"}
        )
        self._thread = threading.Thread(target=self._follow, name="kube-standin-events", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        client = self._events_client
        assert client is not None  # start() made it before this thread
        with contextlib.suppress(Exception):  # the stream ends with an error when close() cuts it
            for event in self._events:
                if event.get("Action") not in ("start", "die", "oom"):
                    continue
                attributes = event.get("Actor", {}).get("Attributes", {})
                try:
                    state = client.api.inspect_container(event["Actor"]["ID"])
                except docker.errors.NotFound:
                    continue
                assert self._loop is not None
                self._loop.call_soon_threadsafe(
                    self._observe, attributes.get(LABEL_POD, ""), attributes.get(LABEL_UID, ""), state
                )

    def remove_all(self) -> None:
        """Force-remove every container of this instance (teardown; also after a failed test)."""
        for container in self.client.containers.list(
            all=True, filters={"label": f"{LABEL_INSTANCE}={self.instance}"}, ignore_removed=True
        ):
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                container.remove(force=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.to_thread(self.remove_all)
        if self._events is not None:
            self._events.close()
        if self._thread is not None and self._events_client is not None:  # start() made both
            await asyncio.to_thread(self._thread.join, 10)
            self._events_client.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- pods -----------------------------------------------------------------------------

    def container_name(self, pod: Obj) -> str:
        return f"kube-standin-{self.instance}-{pod['metadata']['name']}-{pod['metadata']['uid'][:8]}"

    def launch(self, pod: Obj) -> None:
        """Create and start the Pod's container in the background; the status follows."""
        self._spawn(self._launch(pod))

    def _update(self, pod: Obj, change: Any) -> None:
        meta = pod["metadata"]

        def guarded(obj: Obj) -> None:
            if obj["metadata"]["uid"] == meta["uid"]:
                change(obj)

        self.store.update(POD, meta["namespace"], meta["name"], guarded)

    async def _launch(self, pod: Obj) -> None:
        meta = pod["metadata"]
        labels = {
            LABEL_INSTANCE: self.instance,
            LABEL_POD: f"{meta['namespace']}/{meta['name']}",
            LABEL_UID: meta["uid"],
        }
        plan = plan_container(
            pod,
            state_dir=self.state_dir,
            labels=labels,
            name=self.container_name(pod),
            pids_limit=self.pids_limit,
        )
        for claim in plan.claims:
            try:
                self.store.get(PVC, meta["namespace"], claim)
            except Exception:
                message = f'persistentvolumeclaim "{claim}" not found'

                def unschedulable(obj: Obj, message: str = message) -> None:
                    obj["status"]["conditions"] = [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": message,
                        }
                    ]

                self._update(pod, unschedulable)
                return
        if not await self._configmaps_mounted(pod, plan):
            return
        try:
            image = await asyncio.to_thread(self.client.images.get, plan.kwargs["image"])
        except docker.errors.ImageNotFound:
            # The stand-in never pulls (no network but loopback): as imagePullPolicy Never would.
            message = f'Container image "{plan.kwargs["image"]}" is not present with pull policy of Never'
            self._update(
                pod,
                lambda obj: _set_container_status(obj, _waiting("ErrImageNeverPull", message), ready=False),
            )
            return
        user = str(plan.kwargs.get("user") or image.attrs["Config"].get("User") or "0").split(":")[0]
        if plan.run_as_non_root and user in ("0", "root", ""):
            message = "container has runAsNonRoot and image will run as root"
            self._update(
                pod,
                lambda obj: _set_container_status(
                    obj, _waiting("CreateContainerConfigError", message), ready=False
                ),
            )
            return
        try:
            for host_dir in plan.host_dirs:
                await asyncio.to_thread(prepare_host_dir, host_dir)
            container = await asyncio.to_thread(self.client.containers.create, **plan.kwargs)
            await asyncio.to_thread(container.start)
        except docker.errors.APIError as exc:
            message = str(exc.explanation or exc)
            self._update(
                pod,
                lambda obj: _set_container_status(
                    obj, _waiting("CreateContainerError", message), ready=False
                ),
            )

    async def _configmaps_mounted(self, pod: Obj, plan: ContainerPlan) -> bool:
        """Write the Pod's ``configMap`` volumes, waiting (``ContainerCreating``, as the kubelet
        retries its FailedMount) until what they name exists; False: the Pod went meanwhile."""
        meta = pod["metadata"]
        while True:
            ready: list[tuple[Path, dict[str, tuple[bytes, int]], int | None]] = []
            for root, source, fs_group in plan.configmaps:
                try:
                    configmap: Obj | None = self.store.get(
                        CONFIGMAP, meta["namespace"], source.get("name", "")
                    )
                except ApiError:
                    configmap = None
                found = files(source, configmap)
                if isinstance(found, str):
                    break
                ready.append((root, found, fs_group))
            else:
                for root, contents, fs_group in ready:
                    await asyncio.to_thread(write_volume, root, contents, fs_group)
                return True
            # No await between the look and the watch: no change can slip between them.
            changes = self.store.watch(
                CONFIGMAP, meta["namespace"], parse_selector(None), self.store.resource_version
            )
            wait = asyncio.ensure_future(anext(changes))
            self._mount_waits[meta["uid"]] = wait
            try:
                await wait
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                return False  # deleted while it waited
            finally:
                self._mount_waits.pop(meta["uid"], None)
                await changes.aclose()

    def _observe(self, pod_key: str, uid: str, state: Obj) -> None:
        """A container state change from the daemon, written into its Pod's status."""
        namespace, _, name = pod_key.partition("/")
        docker_state = state["State"]
        restarts = int(state.get("RestartCount", 0))

        def change(obj: Obj) -> None:
            if obj["metadata"]["uid"] != uid or obj["status"].get("phase") in ("Succeeded", "Failed"):
                return
            if docker_state.get("Running") or docker_state.get("Restarting"):
                obj["status"]["phase"] = "Running"
                started = {"running": {"startedAt": docker_state.get("StartedAt", now())[:19] + "Z"}}
                _set_container_status(obj, started, ready=True, container_id=state["Id"], restarts=restarts)
                return
            code = int(docker_state.get("ExitCode", 0))
            reason = "OOMKilled" if docker_state.get("OOMKilled") else ("Completed" if code == 0 else "Error")
            terminated = {
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "startedAt": docker_state.get("StartedAt", now())[:19] + "Z",
                    "finishedAt": docker_state.get("FinishedAt", now())[:19] + "Z",
                    "containerID": f"docker://{state['Id']}",
                }
            }
            obj["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
            _set_container_status(obj, terminated, ready=False, container_id=state["Id"], restarts=restarts)

        self.store.update(POD, namespace, name, change)

    async def container_of(self, pod: Obj) -> Any:
        """The Pod's container, or None when there is none (yet, or any more)."""
        try:
            return await asyncio.to_thread(self.client.containers.get, self.container_name(pod))
        except docker.errors.NotFound:
            return None

    def delete(self, pod: Obj, grace: int) -> None:
        """Stop the container (SIGTERM, SIGKILL past ``grace``), remove it, then forget the Pod."""
        waiting = self._mount_waits.pop(pod["metadata"]["uid"], None)
        if waiting is not None:
            waiting.cancel()
        self._spawn(self._delete(pod, grace))

    async def _delete(self, pod: Obj, grace: int) -> None:
        meta = pod["metadata"]
        container = await self.container_of(pod)
        if container is not None:
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                if grace > 0:
                    await asyncio.to_thread(container.stop, timeout=grace)
                await asyncio.to_thread(container.remove, force=True)
        await asyncio.to_thread(shutil.rmtree, pod_dir(self.state_dir, meta["uid"]), True)
        with contextlib.suppress(Exception):
            current = self.store.get(POD, meta["namespace"], meta["name"])
            if current["metadata"]["uid"] == meta["uid"]:
                self.store.delete(POD, meta["namespace"], meta["name"])

    def claim_created(self, pvc: Obj) -> None:
        """A PVC is bound at once to a host directory (no provisioner, no size enforced)."""
        meta = pvc["metadata"]
        pvc_dir(self.state_dir, meta["namespace"], meta["name"]).mkdir(parents=True, exist_ok=True)
        storage = ((pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage", "0")

        def bind(obj: Obj) -> None:
            obj["status"] = {
                "phase": "Bound",
                "accessModes": obj["spec"].get("accessModes", []),
                "capacity": {"storage": storage},
            }
            obj["spec"]["volumeName"] = f"pvc-{meta['uid']}"

        self.store.update(PVC, meta["namespace"], meta["name"], bind)

    async def claim_deleted(self, pvc: Obj) -> None:
        """Reclaim policy Delete, as dynamically provisioned volumes default to: the data goes."""
        meta = pvc["metadata"]
        await asyncio.to_thread(shutil.rmtree, pvc_dir(self.state_dir, meta["namespace"], meta["name"]), True)
