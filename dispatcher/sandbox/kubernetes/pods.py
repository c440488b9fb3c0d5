"""Reading a sandbox Pod as the API returns it: is it running, when was it made, why can it never
start, and may a restarted server re-adopt it for a session."""

from __future__ import annotations

import contextlib
import datetime
import time

from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.container.labels import LABEL_SPEC
from dispatcher.sandbox.kubernetes.api import Obj
from dispatcher.sandbox.kubernetes.manifests import fingerprint, pod_labels

_FATAL_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


def created_at(pod: Obj) -> float:
    """Its creation time (epoch seconds); now when it does not say."""
    stamp = (pod.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return time.time()
    with contextlib.suppress(ValueError):
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return time.time()


def pod_running(pod: Obj | None) -> bool:
    return (
        pod is not None
        and (pod.get("status") or {}).get("phase") == "Running"
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
    )


def cannot_start(pod: Obj) -> tuple[str, str] | None:
    """(reason, message) when its container waits for something that will not come by itself."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") in _FATAL_WAITING:
            return str(waiting["reason"]), str(waiting.get("message") or "")
    return None


def adoption_problem(
    pod: Obj, session: Session, instance: str, config: SandboxConfig, kube: KubernetesConfig
) -> str | None:
    """Why a listed Pod cannot be the session's after a restart; None: it can."""
    labels = pod["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in pod_labels(instance, session).items()):
        return "its pod's labels no longer matched the session after the server restarted"
    if labels.get(LABEL_SPEC) != fingerprint(config, kube, session):
        return (
            "the sandbox configuration (image, limits, user, workspace or grants) changed across the restart"
        )
    if not pod_running(pod):
        return f"its pod had stopped ({(pod.get('status') or {}).get('phase')}) when the server restarted"
    lifetime = config.max_lifetime_seconds
    if lifetime is not None and time.time() - created_at(pod) >= lifetime:
        return f"its pod had reached the sandbox's maximum lifetime ({lifetime:g} s)"
    return None
