"""The objects the Kubernetes backend creates, as plain manifests (pure functions).

A session's Pod runs the agent as its only process (``stdin`` open, never a tty), hardened as the
Docker containers are: not root (the tenant's uid/gid), a read-only root, no privilege escalation,
every capability dropped, the runtime's default seccomp profile, no service account token, no
service links, CPU / memory / ephemeral-storage limits, ``/tmp`` in memory with a size limit and an
optional RuntimeClass. The workspace is a PVC per workspace mounted at ``/workspace`` (with grants:
only the granted directories, read-only where the grant is). ``shareProcessNamespace`` makes the
Pod's pause process pid 1, so the processes commands orphan are reaped (as docker-init does).

``config-check --show-pod`` prints ``pod_manifest`` so an operator can review exactly this.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Any

from dispatcher.core.errors import ConfigError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import WORKSPACE_ROOT, SandboxConfig, parse_size, process_limit_args
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.container.labels import (
    LABEL_INSTANCE,
    LABEL_SESSION,
    LABEL_SPEC,
    LABEL_TENANT,
    spec_fingerprint,
)
from dispatcher.sandbox.grants import agent_grant_args
from dispatcher.sandbox.kubernetes.ca import ca_volume

Manifest = dict[str, Any]

LABEL_WORKSPACE = "dispatcher.workspace"
"""On a PVC: a digest of the tenant and workspace it holds (the names are in annotations)."""
ANNOTATION_SESSION = "dispatcher.session"
ANNOTATION_TENANT = "dispatcher.tenant"
ANNOTATION_WORKSPACE = "dispatcher.workspace"
NETWORK_POLICY = "sandboxes-deny-all"
"""The name deploy/kubernetes/sandbox-networkpolicy.yaml gives it too: one policy, whoever made it."""
CONTAINER = "agent"
TERMINATION_GRACE_SECONDS = 2
"""The agent is pid 2 behind the pause process; a delete the backend makes uses 0 anyway."""
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else a digest of it that is one (same every time)."""
    if _LABEL_VALUE.match(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def _dns(text: str, size: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:size].strip("-") or "x"


def pod_name(instance: str, session_id: str) -> str:
    """A fresh Pod name for the session (a recreated sandbox gets a new one)."""
    digest = hashlib.sha256(session_id.encode()).hexdigest()[:10]
    return f"dispatcher-{_dns(instance, 12)}-{_dns(session_id, 20)}-{digest}-{secrets.token_hex(3)}"


def workspace_key(session: Session) -> str:
    """What names the session's workspace across sessions: its tenant and its workspace."""
    where = session.workspace_name if session.workspace_root is not None else session.workspace_path
    return f"{session.tenant_id}/{where}"


def pvc_name(session: Session) -> str:
    """The workspace's PVC: one per tenant and workspace, the same for every session using it."""
    digest = hashlib.sha256(workspace_key(session).encode()).hexdigest()[:16]
    return f"ws-{_dns(session.tenant_id, 30)}-{digest}"


def sandbox_ids(config: SandboxConfig, session: Session) -> tuple[int, int]:
    """The numeric uid and gid the Pod runs as (``runAsNonRoot`` needs numbers).

    Raises:
        ConfigError: ``sandbox.user`` is a name, or root.
    """
    uid, _, gid = config.user_for(session.sandbox_uid, session.sandbox_gid).partition(":")
    if not uid.isdigit() or (gid and not gid.isdigit()):
        raise ConfigError(
            f"sandbox.user must be numeric (uid:gid) for the kubernetes backend, got {uid}:{gid}"
        )
    return int(uid), int(gid or uid)


def _quantity(size: int) -> str:
    """Bytes as a Kubernetes quantity, binary suffix when exact (``64Mi``)."""
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _cpu(nano_cpus: int) -> str:
    return f"{max(1, nano_cpus // 1_000_000)}m"


def fingerprint(config: SandboxConfig, kube: KubernetesConfig, session: Session) -> str:
    """What the Pod was made from (the Docker backend's fingerprint, plus the cluster settings)."""
    return hashlib.sha256((spec_fingerprint(config, session) + repr(kube)).encode()).hexdigest()[:32]


def pod_labels(instance: str, session: Session) -> dict[str, str]:
    return {
        LABEL_INSTANCE: label_value(instance),
        LABEL_SESSION: label_value(session.session_id),
        LABEL_TENANT: label_value(session.tenant_id),
    }


def _volumes(config: SandboxConfig, session: Session, claim: str) -> tuple[list[Manifest], list[Manifest]]:
    """(volumes, the agent's volumeMounts): /tmp in memory, the workspace (or its granted parts)."""
    volumes: list[Manifest] = [
        {
            "name": "tmp",
            "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(parse_size(config.tmpfs_size))},
        },
        {"name": "workspace", "persistentVolumeClaim": {"claimName": claim}},
    ]
    mounts: list[Manifest] = [{"name": "tmp", "mountPath": "/tmp"}]
    caps = session.capabilities
    if caps is None or caps.fs_grants is None:
        mounts.append({"name": "workspace", "mountPath": WORKSPACE_ROOT})
        return volumes, mounts
    grants = {g.prefix.strip("/") or ".": g.mode for g in caps.fs_grants}
    if "." in grants:
        mounts.append({"name": "workspace", "mountPath": WORKSPACE_ROOT, "readOnly": grants["."] == "r"})
    else:
        # Nothing of the workspace but the granted directories exists (as on Docker).
        volumes.append({"name": "empty-root", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
        mounts.append({"name": "empty-root", "mountPath": WORKSPACE_ROOT, "readOnly": True})
    for prefix, mode in sorted(grants.items()):
        if prefix != ".":
            mounts.append(
                {
                    "name": "workspace",
                    "mountPath": f"{WORKSPACE_ROOT}/{prefix}",
                    "subPath": prefix,
                    "readOnly": mode == "r",
                }
            )
    return volumes, mounts


def pod_manifest(
    config: SandboxConfig,
    kube: KubernetesConfig,
    session: Session,
    *,
    instance: str,
    name: str,
    ca: str | None = None,
) -> Manifest:
    """The session's Pod; ``ca``: the ConfigMap of its tenant's egress CA bundle (``ca.py``),
    mounted read-only at the Docker backend's path.

    Raises:
        ConfigError: the sandbox user is not numeric.
    """
    uid, gid = sandbox_ids(config, session)
    claim = pvc_name(session)
    volumes, mounts = _volumes(config, session, claim)
    if ca is not None:
        volume, mount = ca_volume(ca)
        volumes.append(volume)
        mounts.append(mount)
    limits = {
        "cpu": _cpu(config.nano_cpus),
        "memory": _quantity(config.mem_limit),
        "ephemeral-storage": _quantity(kube.ephemeral_storage),
    }
    security: Manifest = {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": gid,
        "readOnlyRootFilesystem": config.read_only,
        "allowPrivilegeEscalation": not config.no_new_privileges,
        "capabilities": {
            "drop": list(config.cap_drop),
            **({"add": list(config.cap_add)} if config.cap_add else {}),
        },
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    agent = [
        config.agent_python,
        "-I",
        config.agent_path,
        "--root",
        WORKSPACE_ROOT,
        *agent_grant_args(session),
        *process_limit_args(config.processes),
    ]
    container: Manifest = {
        "name": CONTAINER,
        "image": config.image,
        "imagePullPolicy": "IfNotPresent",
        # -I: no PYTHON* variables or user site-packages in the agent (as on Docker).
        "command": agent,
        # stdin stays open across attaches (stdinOnce false): a restarted server attaches again.
        "stdin": True,
        "stdinOnce": False,
        "tty": False,
        "workingDir": WORKSPACE_ROOT,
        "securityContext": security,
        "resources": {"limits": limits, "requests": dict(limits)},
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    annotations = {
        **kube.pod_annotations,
        ANNOTATION_SESSION: session.session_id,
        ANNOTATION_TENANT: session.tenant_id,
        ANNOTATION_WORKSPACE: workspace_key(session),
    }
    spec: Manifest = {
        "restartPolicy": "Never",
        "hostname": "sandbox",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": True,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": uid,
            "runAsGroup": gid,
            "fsGroup": gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if kube.runtime_class_name:
        spec["runtimeClassName"] = kube.runtime_class_name
    if kube.node_selector:
        spec["nodeSelector"] = dict(kube.node_selector)
    if kube.tolerations:
        spec["tolerations"] = [t.manifest() for t in kube.tolerations]
    if kube.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in kube.image_pull_secrets]
    labels = {**config.extra_labels, **pod_labels(instance, session)}
    labels[LABEL_SPEC] = fingerprint(config, kube, session)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": kube.namespace, "labels": labels, "annotations": annotations},
        "spec": spec,
    }


def pvc_manifest(config: SandboxConfig, kube: KubernetesConfig, session: Session) -> Manifest:
    """The workspace's claim: sized to the tenant's workspace quota (1Gi without one)."""
    size = config.workspace_quota or 1 << 30
    spec: Manifest = {
        "accessModes": [kube.access_mode],
        "resources": {"requests": {"storage": _quantity(size)}},
    }
    if kube.storage_class:
        spec["storageClassName"] = kube.storage_class
    key = workspace_key(session)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name(session),
            "namespace": kube.namespace,
            "labels": {
                LABEL_TENANT: label_value(session.tenant_id),
                LABEL_WORKSPACE: hashlib.sha256(key.encode()).hexdigest()[:40],
            },
            "annotations": {ANNOTATION_TENANT: session.tenant_id, ANNOTATION_WORKSPACE: key},
        },
        "spec": spec,
    }


def network_policy_manifest(namespace: str) -> Manifest:
    """Deny all ingress and egress for every Pod of the sandbox namespace (the server attaches
    through the API server; egress goes through the agent's tunnel, under the server's policy)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": NETWORK_POLICY, "namespace": namespace},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }
