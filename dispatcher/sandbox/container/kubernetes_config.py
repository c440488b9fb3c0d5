"""``sandbox.kubernetes:``: where and how the Kubernetes backend makes its Pods.

The limits, image, user, idle and lifetime settings are the ``sandbox:`` section's own (shared with
the Docker backend); this section holds only what a cluster adds. It lives beside the ``sandbox:``
section rather than in ``kubernetes/`` so that the config package, which reads both, imports no backend.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from dispatcher.config_base import Section, Text
from dispatcher.sandbox.container.config import SizeText, parse_size

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

DnsLabel = Annotated[str, Field(strict=True, pattern=_DNS_LABEL, max_length=63)]
KubeBytes = Annotated[
    int, BeforeValidator(parse_size, json_schema_input_type=Annotated[int, Field(gt=0)] | SizeText)
]


def _qualified_keys(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not _QUALIFIED.match(key) or len(key) > 317:
            raise ValueError(f"{key!r} is not a qualified Kubernetes key (prefix/name)")
    return value


QualifiedMap = Annotated[
    dict[Annotated[str, Field(strict=True)], Annotated[str, Field(strict=True)]],
    AfterValidator(_qualified_keys),
]


class Toleration(Section):
    """One toleration of the sandbox Pods (as in a Pod spec)."""

    key: Text | None = None
    """The taint's key (``null`` with ``Exists``: every taint)."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """``Equal``: the taint's value must be ``value``; ``Exists``: any value."""
    value: Annotated[str, Field(strict=True)] | None = None
    """The taint's value, with ``Equal``."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect tolerated (``null``: all)."""
    toleration_seconds: Annotated[int, Field(strict=True, ge=0)] | None = None
    """With ``NoExecute``: how long the Pod stays once tainted."""

    def manifest(self) -> dict[str, object]:
        out: dict[str, object] = {"operator": self.operator}
        for name, value in (("key", self.key), ("value", self.value), ("effect", self.effect)):
            if value is not None:
                out[name] = value
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


class KubernetesConfig(Section):
    """The cluster side of ``sandbox.backend: kubernetes``."""

    namespace: DnsLabel = "dispatcher-sandboxes"
    """Where sandbox Pods, workspace PVCs and the deny-all NetworkPolicy live (deploy/kubernetes)."""
    kubeconfig: Text | None = None
    """A kubeconfig file; ``null``: in-cluster (the server Pod's service account)."""
    context: Text | None = None
    """The kubeconfig context (``null``: its current one)."""
    runtime_class_name: DnsLabel | None = None
    """A RuntimeClass for the Pods (gVisor or Kata, deploy/kubernetes/examples); ``null``: the node's."""
    storage_class: Text | None = None
    """StorageClass of workspace PVCs; ``null``: the cluster's default class."""
    access_mode: Literal["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"] = "ReadWriteOnce"
    """Access mode of workspace PVCs (README: what two sessions on one workspace meet)."""
    ephemeral_storage: KubeBytes = 1 << 30
    """The Pod's ephemeral-storage limit (its writable layer and logs; /tmp is memory)."""
    node_selector: dict[Annotated[str, Field(strict=True)], Annotated[str, Field(strict=True)]] = Field(
        default_factory=dict
    )
    """``nodeSelector`` of the sandbox Pods."""
    tolerations: tuple[Toleration, ...] = ()
    """Tolerations of the sandbox Pods."""
    image_pull_secrets: tuple[DnsLabel, ...] = ()
    """Secrets (in the sandbox namespace) to pull the sandbox image with."""
    pod_annotations: QualifiedMap = Field(default_factory=dict)
    """Annotations added to every sandbox Pod (the ``dispatcher.*`` ones are the backend's)."""
    network_policy: bool = True
    """Create the deny-all NetworkPolicy in the namespace at start when it is missing."""
    pod_ready_timeout_seconds: Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)] = 120.0
    """How long a new Pod may take to run (scheduling, image pull) before the launch fails."""
