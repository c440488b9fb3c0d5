"""A tenant's ``egress.ca_bundle`` in its Pods: a ConfigMap per bundle, mounted read-only.

No host file reaches a Pod, so the bundle travels as an object: the server reads the file (as the
Docker backend copies it, so what is mounted is what was checked), and makes one ConfigMap per
(server instance, bundle content), named by their digest, ``immutable`` (its data never changes,
so the kubelet need not watch it) and labelled with the instance. Each Pod of a tenant with a
bundle mounts it at ``CA_TARGET`` (the Docker backend's path) with ``subPath``, read-only, and its
commands are told of it by the same five variables (``dispatcher.egress.gate.ca_env``).

Creating is idempotent: a name that exists (409) holds the same bytes, which is checked once per
process. Clean-up: a ConfigMap of this instance that no Pod of this instance mounts is deleted when
the server starts (``remove_orphans``), once it has settled which Pods stay; a launch in flight
during that sweep keeps its own (``CaMaps.guard``). Bundles change rarely, so between starts the
few stale ones cost nothing.

A ConfigMap holds at most 1 MiB (the API server refuses more): a bigger bundle fails the launch
with a message saying so, where Docker takes 16 MiB.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.config import CA_TARGET
from dispatcher.sandbox.container.labels import LABEL_INSTANCE

Manifest = dict[str, Any]

CA_KEY = "ca-bundle.crt"
"""The ConfigMap's one key, and the file name mounted (``subPath``) at ``CA_TARGET``."""
CA_VOLUME = "egress-ca"
LABEL_CA = "dispatcher.ca-bundle"
"""On the ConfigMap: ``"true"``, so a list by label finds only these."""
ANNOTATION_SHA256 = "dispatcher.ca-bundle/sha256"
MAX_CONFIGMAP_BYTES = 1 << 20
"""What the API server accepts in one ConfigMap, keys included (``MaxSecretSize``)."""


def read_bundle(path: str) -> bytes:
    """The bundle's bytes, read once from a regular file.

    Raises:
        SandboxError: not a regular file, too big for a ConfigMap, or unreadable.
    """
    limit = MAX_CONFIGMAP_BYTES - len(CA_KEY)
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise SandboxError(f"egress.ca_bundle {path!r} is not a regular file")
            data = f.read(limit + 1)
    except OSError as exc:
        raise SandboxError(f"egress.ca_bundle {path!r} cannot be read: {exc.strerror}") from None
    if len(data) > limit:
        raise SandboxError(
            f"egress.ca_bundle {path!r} is larger than a ConfigMap holds ({limit} bytes) "
            "for the kubernetes backend"
        )
    return data


def configmap_name(instance: str, data: bytes) -> str:
    """The same name for the same instance and bytes, and for nothing else (in practice)."""
    digest = hashlib.sha256(instance.encode() + b"\0" + hashlib.sha256(data).digest()).hexdigest()
    return f"dispatcher-ca-{digest[:40]}"


def configmap_manifest(namespace: str, instance: str, data: bytes, *, instance_label: str) -> Manifest:
    """The immutable ConfigMap holding ``data`` (text as ``data``, anything else as ``binaryData``)."""
    try:
        content: Manifest = {"data": {CA_KEY: data.decode("utf-8")}}
    except UnicodeDecodeError:
        content = {"binaryData": {CA_KEY: base64.b64encode(data).decode("ascii")}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(instance, data),
            "namespace": namespace,
            "labels": {LABEL_INSTANCE: instance_label, LABEL_CA: "true"},
            "annotations": {ANNOTATION_SHA256: hashlib.sha256(data).hexdigest()},
        },
        "immutable": True,
        **content,
    }


def same_content(existing: Manifest, wanted: Manifest) -> bool:
    """Whether a ConfigMap found under the wanted name holds the wanted bytes, and cannot change."""
    return bool(existing.get("immutable")) and all(
        (existing.get(key) or {}) == (wanted.get(key) or {}) for key in ("data", "binaryData")
    )


def ca_volume(name: str) -> tuple[Manifest, Manifest]:
    """(the Pod's volume, the agent's read-only mount of its one file at ``CA_TARGET``)."""
    volume = {
        "name": CA_VOLUME,
        "configMap": {"name": name, "items": [{"key": CA_KEY, "path": CA_KEY}], "defaultMode": 0o444},
    }
    mount = {"name": CA_VOLUME, "mountPath": CA_TARGET, "subPath": CA_KEY, "readOnly": True}
    return volume, mount


def mounted_ca(pod: Manifest) -> str | None:
    """The ConfigMap a Pod mounts as its CA bundle; None: it mounts none."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == CA_VOLUME and isinstance(volume.get("configMap"), dict):
            name = volume["configMap"].get("name")
            return str(name) if name else None
    return None


class CaMaps:
    """This process's view of its CA ConfigMaps: which are known to exist, which are in use by a
    launch right now (so a concurrent sweep keeps them)."""

    def __init__(self) -> None:
        self.known: set[str] = set()
        self._in_use: dict[str, int] = {}
        self._sweep_seen: set[str] | None = None

    @contextmanager
    def using(self, name: str | None) -> Iterator[None]:
        """Held from making sure the ConfigMap exists until the Pod naming it is created (None:
        the Pod mounts none)."""
        if name is None:
            yield
            return
        self._in_use[name] = self._in_use.get(name, 0) + 1
        if self._sweep_seen is not None:
            self._sweep_seen.add(name)
        try:
            yield
        finally:
            self._in_use[name] -= 1
            if not self._in_use[name]:
                del self._in_use[name]

    @contextmanager
    def guard(self) -> Iterator[set[str]]:
        """During a sweep: the names every launch used meanwhile (and those in use at its start)."""
        seen = set(self._in_use)
        self._sweep_seen = seen
        try:
            yield seen
        finally:
            self._sweep_seen = None

    def forget(self, names: Iterable[str]) -> None:
        self.known.difference_update(names)
