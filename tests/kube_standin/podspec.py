"""A Pod's spec translated into the Docker container that stands in for it.

Only one container per Pod; the settings a sandbox Pod uses are translated (volumes: ``emptyDir``,
``persistentVolumeClaim`` and ``configMap``, see ``configmaps.py``), every other field the
backend could set and this cannot honour is refused with 422 rather than silently dropped, so a test
never passes on a setting the stand-in ignored. Stored and ignored on purpose (no scheduling here):
nodeSelector, tolerations, imagePullSecrets, annotations, requests, automountServiceAccountToken and
enableServiceLinks (no token or service variables are ever injected), seccompProfile RuntimeDefault
(Docker's default profile is on anyway).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.kube_standin.configmaps import validate_volume
from tests.kube_standin.status import Cause

Obj = dict[str, Any]

RUNTIMES = {"gvisor": "runsc", "runsc": "runsc"}
"""runtimeClassName → Docker runtime: the RuntimeClass example in deploy/kubernetes names gVisor."""

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: dict[str, Decimal | int] = {
    "m": Decimal("0.001"),
    "": Decimal(1),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|)$")
_POD_KEYS = {
    "containers", "volumes", "securityContext", "restartPolicy", "runtimeClassName", "nodeSelector",
    "tolerations", "imagePullSecrets", "automountServiceAccountToken", "enableServiceLinks",
    "terminationGracePeriodSeconds", "serviceAccountName", "hostname", "activeDeadlineSeconds",
    "shareProcessNamespace",
}  # fmt: skip
_CONTAINER_KEYS = {
    "name", "image", "imagePullPolicy", "command", "args", "env", "workingDir", "stdin", "stdinOnce",
    "tty", "securityContext", "resources", "volumeMounts", "terminationMessagePolicy",
}  # fmt: skip
_HOST_KEYS = {"hostNetwork", "hostPID", "hostIPC"}
_SOURCES = {"emptyDir", "persistentVolumeClaim", "configMap"}


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "1.5", "64Mi", "1e3") as a number.

    Raises:
        ValueError: not a quantity.
    """
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression {_QUANTITY.pattern!r}: {text!r}")
    number, suffix = m.groups()
    scale = _BINARY.get(suffix) or _DECIMAL[suffix]
    return Decimal(number) * scale


def _container(pod: Obj) -> Obj:
    containers: list[Obj] = pod["spec"]["containers"]
    return containers[0]


def validate_pod(pod: Obj) -> list[Cause]:
    """What the stand-in refuses in a Pod (422), beyond the metadata every kind gets."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [Cause("FieldValueRequired", "Required value", "spec")]
    causes: list[Cause] = []
    for key in sorted(set(spec) & _HOST_KEYS):
        if spec[key]:
            causes.append(
                Cause("FieldValueForbidden", "Forbidden: not modelled by the stand-in", f"spec.{key}")
            )
    for key in sorted(set(spec) - _POD_KEYS - _HOST_KEYS):
        causes.append(
            Cause("FieldValueNotSupported", "Unsupported value: not modelled by the stand-in", f"spec.{key}")
        )
    containers = spec.get("containers") or []
    if len(containers) != 1:
        causes.append(
            Cause("FieldValueInvalid", "the stand-in runs exactly one container", "spec.containers")
        )
        return causes
    container = containers[0]
    for key in ("name", "image"):
        if not container.get(key):
            causes.append(Cause("FieldValueRequired", "Required value", f"spec.containers[0].{key}"))
    for key in sorted(set(container) - _CONTAINER_KEYS):
        causes.append(
            Cause(
                "FieldValueNotSupported",
                "Unsupported value: not modelled by the stand-in",
                f"spec.containers[0].{key}",
            )
        )
    for env in container.get("env") or []:
        if "valueFrom" in env:
            causes.append(
                Cause("FieldValueNotSupported", "valueFrom is not modelled", "spec.containers[0].env")
            )
    for name, value in ((container.get("resources") or {}).get("limits") or {}).items():
        try:
            parse_quantity(value)
        except ValueError as exc:
            causes.append(
                Cause("FieldValueInvalid", str(exc), f"spec.containers[0].resources.limits[{name}]")
            )
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    for index, (name, volume) in enumerate(volumes.items()):
        sources = _SOURCES & set(volume)
        if not sources:
            causes.append(
                Cause(
                    "FieldValueNotSupported",
                    "only emptyDir, persistentVolumeClaim and configMap",
                    f"spec.volumes[{name}]",
                )
            )
        elif len(sources) > 1:
            causes.append(
                Cause(
                    "FieldValueForbidden", "may not specify more than 1 volume type", f"spec.volumes[{index}]"
                )
            )
        elif "configMap" in volume:
            causes += validate_volume(index, volume["configMap"] or {})
    for i, mount in enumerate(container.get("volumeMounts") or []):
        if mount.get("name") not in volumes:
            causes.append(
                Cause(
                    "FieldValueNotFound",
                    f"Not found: {mount.get('name')!r}",
                    "spec.containers[0].volumeMounts",
                )
            )
        sub = str(mount.get("subPath") or "")
        if sub.startswith("/") or ".." in sub.split("/"):
            causes.append(
                Cause(
                    "FieldValueInvalid",
                    f"Invalid value: \"{sub}\": must be a relative path without '..'",
                    f"spec.containers[0].volumeMounts[{i}].subPath",
                )
            )
    policy = spec.get("restartPolicy", "Always")
    if policy not in ("Always", "OnFailure", "Never"):
        causes.append(Cause("FieldValueNotSupported", f"Unsupported value: {policy!r}", "spec.restartPolicy"))
    return causes


def _merged_security(pod: Obj) -> Obj:
    """The container's securityContext over the Pod's (the container wins, as in the kubelet)."""
    pod_level = {k: v for k, v in (pod["spec"].get("securityContext") or {}).items()}
    container_level = _container(pod).get("securityContext") or {}
    return {**pod_level, **container_level}


@dataclass(frozen=True)
class HostDir:
    """A host directory bind-mounted for a volume, and the group it is given (fsGroup)."""

    path: Path
    fs_group: int | None


@dataclass(frozen=True)
class ContainerPlan:
    """Arguments for ``docker.containers.create`` and the host directories to prepare first."""

    kwargs: dict[str, Any]
    host_dirs: list[HostDir] = field(default_factory=list)
    claims: list[str] = field(default_factory=list)
    configmaps: list[tuple[Path, Obj, int | None]] = field(default_factory=list)
    """Each ``configMap`` volume mounted: (where its files go, its source, the fsGroup)."""
    run_as_non_root: bool = False


def pvc_dir(state_dir: Path, namespace: str, claim: str) -> Path:
    return state_dir / "pvc" / namespace / claim


def pod_dir(state_dir: Path, uid: str) -> Path:
    return state_dir / "pods" / uid


def plan_container(
    pod: Obj, *, state_dir: Path, labels: dict[str, str], name: str, pids_limit: int
) -> ContainerPlan:
    """Translate a validated Pod into a Docker container (network ``none`` always)."""
    spec = pod["spec"]
    meta = pod["metadata"]
    container = _container(pod)
    security = _merged_security(pod)
    pod_security = spec.get("securityContext") or {}
    kwargs: dict[str, Any] = {
        "image": container["image"],
        "name": name,
        "labels": labels,
        # docker-py sets StdinOnce only for a non-detached create with stdin open: that is how
        # stdinOnce (close the container's stdin when the first attach ends) gets through.
        "detach": not (container.get("stdin") and container.get("stdinOnce")),
        "network_mode": "none",
        "hostname": (spec.get("hostname") or meta["name"])[:63],
        "stdin_open": bool(container.get("stdin")),
        "tty": bool(container.get("tty")),
        "environment": {e["name"]: str(e.get("value", "")) for e in container.get("env") or []},
        "pids_limit": pids_limit,  # the kubelet's podPidsLimit: node configuration, not in the Pod
    }
    if spec.get("shareProcessNamespace"):
        # The Pod's pause process becomes pid 1 and reaps orphans: docker-init does the same.
        kwargs["init"] = True
    if container.get("command") is not None:
        kwargs["entrypoint"] = list(container["command"])
    if container.get("args") is not None:
        kwargs["command"] = list(container["args"])
    if container.get("workingDir"):
        kwargs["working_dir"] = container["workingDir"]
    if "runAsUser" in security:
        group = security.get("runAsGroup")
        kwargs["user"] = (
            f"{security['runAsUser']}:{group}" if group is not None else str(security["runAsUser"])
        )
    groups = [*pod_security.get("supplementalGroups", [])]
    fs_group = pod_security.get("fsGroup")
    if fs_group is not None:
        groups.append(fs_group)
    if groups:
        kwargs["group_add"] = [str(g) for g in groups]
    if security.get("readOnlyRootFilesystem"):
        kwargs["read_only"] = True
    caps = security.get("capabilities") or {}
    if caps.get("drop"):
        kwargs["cap_drop"] = list(caps["drop"])
    if caps.get("add"):
        kwargs["cap_add"] = list(caps["add"])
    if security.get("allowPrivilegeEscalation") is False:
        kwargs["security_opt"] = ["no-new-privileges"]
    if (security.get("seccompProfile") or {}).get("type") == "Unconfined":
        kwargs.setdefault("security_opt", []).append("seccomp=unconfined")
    limits = (container.get("resources") or {}).get("limits") or {}
    if "cpu" in limits:
        kwargs["nano_cpus"] = int(parse_quantity(limits["cpu"]) * 10**9)
    if "memory" in limits:
        memory = int(parse_quantity(limits["memory"]))
        kwargs["mem_limit"] = memory
        kwargs["memswap_limit"] = memory  # no swap, as on a kubelet node
    runtime_class = spec.get("runtimeClassName")
    if runtime_class:
        kwargs["runtime"] = RUNTIMES[runtime_class]
    restart = spec.get("restartPolicy", "Always")
    if restart == "Always":
        kwargs["restart_policy"] = {"Name": "always"}
    elif restart == "OnFailure":
        kwargs["restart_policy"] = {"Name": "on-failure"}

    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    binds: dict[str, dict[str, str]] = {}
    tmpfs: dict[str, str] = {}
    host_dirs: list[HostDir] = []
    claims: list[str] = []
    configmaps: list[tuple[Path, Obj, int | None]] = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        mode = "ro" if mount.get("readOnly") else "rw"
        if "emptyDir" in volume and (volume["emptyDir"] or {}).get("medium") == "Memory":
            options = ["mode=0777"]  # the kubelet's emptyDir permission
            if (volume["emptyDir"] or {}).get("sizeLimit"):
                options.append(f"size={int(parse_quantity(volume['emptyDir']['sizeLimit']))}")
            if mode == "ro":
                options.append("ro")
            tmpfs[mount["mountPath"]] = ",".join(options)
            continue
        if "configMap" in volume:
            # Always read-only, whatever the mount says (the kubelet forces it).
            root = pod_dir(state_dir, meta["uid"]) / "configMap" / mount["name"]
            if all(r != root for r, _, _ in configmaps):
                configmaps.append((root, volume["configMap"], fs_group))
            source = root / mount["subPath"] if mount.get("subPath") else root
            binds[str(source)] = {"bind": mount["mountPath"], "mode": "ro"}
            continue
        if "emptyDir" in volume:
            root = pod_dir(state_dir, meta["uid"]) / "emptyDir" / mount["name"]
        else:
            claim = volume["persistentVolumeClaim"]["claimName"]
            claims.append(claim)
            root = pvc_dir(state_dir, meta["namespace"], claim)
            if volume["persistentVolumeClaim"].get("readOnly"):
                mode = "ro"
        host_dirs.append(HostDir(root, fs_group))
        source = root / mount["subPath"] if mount.get("subPath") else root
        binds[str(source)] = {"bind": mount["mountPath"], "mode": mode}
    if binds:
        kwargs["volumes"] = binds
    if tmpfs:
        kwargs["tmpfs"] = tmpfs
    return ContainerPlan(kwargs, host_dirs, claims, configmaps, bool(security.get("runAsNonRoot")))


def prepare_host_dir(host_dir: HostDir) -> None:
    """Create the directory and, with an fsGroup, give the tree to that group as the kubelet does."""
    host_dir.path.mkdir(parents=True, exist_ok=True)
    if host_dir.fs_group is None:
        return
    for root, dirs, files in os.walk(host_dir.path):
        for name in [*dirs, *files]:
            _own(Path(root) / name, host_dir.fs_group)
    _own(host_dir.path, host_dir.fs_group)


def _own(path: Path, group: int) -> None:
    if path.is_symlink():
        os.lchown(path, -1, group)
        return
    os.chown(path, -1, group)
    extra = 0o2070 if path.is_dir() else 0o060
    path.chmod(path.stat().st_mode & 0o7777 | extra)
