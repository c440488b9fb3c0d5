"""The egress CA bundle of the Kubernetes backend, without a cluster: its ConfigMap (named by the
instance and the bytes, immutable, text or binary), the Pod's read-only mount of it, what a bundle
may be, which names a sweep must keep, and ``config-check --show-pod`` printing it."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cli import main
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import CA_TARGET, SandboxConfig
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.container.labels import LABEL_INSTANCE
from dispatcher.sandbox.kubernetes.backend import KubernetesSandboxProvider
from dispatcher.sandbox.kubernetes.ca import (
    CA_KEY,
    CA_VOLUME,
    LABEL_CA,
    CaMaps,
    configmap_manifest,
    configmap_name,
    mounted_ca,
    read_bundle,
    same_content,
)
from dispatcher.sandbox.kubernetes.manifests import pod_manifest

PEM = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
SESSION = Session("s1", "/w/t/p", tenant_id="acme", workspace_root="/w/t", workspace_name="p")


def test_kubernetes_ca_configmap_is_immutable_and_named_by_instance_and_bytes() -> None:
    made = configmap_manifest("ns", "inst", PEM, instance_label="inst")
    assert made["immutable"] is True and made["data"] == {CA_KEY: PEM.decode()}
    assert made["metadata"]["labels"] == {LABEL_INSTANCE: "inst", LABEL_CA: "true"}
    assert made["metadata"]["name"] == configmap_name("inst", PEM)
    assert configmap_name("inst", PEM) != configmap_name("other", PEM)
    assert configmap_name("inst", PEM) != configmap_name("inst", PEM + b"\n")
    binary = configmap_manifest("ns", "inst", b"\x30\x82\xff", instance_label="inst")
    assert "data" not in binary and base64.b64decode(binary["binaryData"][CA_KEY]) == b"\x30\x82\xff"
    assert same_content(dict(made), made)
    assert not same_content({**made, "data": {CA_KEY: "other"}}, made)
    assert not same_content({**made, "immutable": False}, made)  # could change under the Pods


def test_kubernetes_pod_mounts_the_ca_configmap_read_only_at_the_docker_path() -> None:
    pod = pod_manifest(SandboxConfig(), KubernetesConfig(), SESSION, instance="i", name="p", ca="cm")
    assert {"name": CA_VOLUME, "configMap": {"name": "cm", "items": [{"key": CA_KEY, "path": CA_KEY}],
            "defaultMode": 0o444}} in pod["spec"]["volumes"]  # fmt: skip
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": CA_VOLUME, "mountPath": CA_TARGET, "subPath": CA_KEY, "readOnly": True} in mounts
    assert mounted_ca(pod) == "cm"
    plain = pod_manifest(SandboxConfig(), KubernetesConfig(), SESSION, instance="i", name="p")
    assert mounted_ca(plain) is None and all(v["name"] != CA_VOLUME for v in plain["spec"]["volumes"])


def test_kubernetes_ca_bundle_must_be_a_file_a_configmap_holds(tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(PEM)
    assert read_bundle(str(bundle)) == PEM
    bundle.write_bytes(b"x" * (1 << 20))
    with pytest.raises(SandboxError, match="larger than a ConfigMap holds"):
        read_bundle(str(bundle))
    with pytest.raises(SandboxError, match="not a regular file"):
        read_bundle("/dev/null")
    with pytest.raises(SandboxError, match="cannot be read"):
        read_bundle(str(tmp_path / "missing.pem"))


def test_kubernetes_ca_sweep_keeps_what_launches_use_meanwhile() -> None:
    cas = CaMaps()
    with cas.using("before"), cas.guard() as kept:
        with cas.using("during"):
            pass
        with cas.using(None):
            pass
    assert kept == {"before", "during"}
    with cas.guard() as kept:
        pass
    assert kept == set()  # nothing in use any more


def test_kubernetes_show_pod_prints_the_ca_configmap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(PEM)
    path = tmp_path / "c.yaml"
    sandbox = {"backend": "kubernetes", "instance": "inst", "kubernetes": {"namespace": "sandboxes"}}
    path.write_text(
        yaml.safe_dump(
            {"home": str(tmp_path / "home"), "sandbox": sandbox, "egress": {"ca_bundle": str(bundle)}}
        )
    )
    assert main(["config-check", str(path), "--show-pod"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Pod", "PersistentVolumeClaim", "NetworkPolicy", "ConfigMap"]
    assert docs[3] == configmap_manifest("sandboxes", "inst", PEM, instance_label="inst")
    assert mounted_ca(docs[0]) == docs[3]["metadata"]["name"]


class _RefusingConfigMaps:
    """An API whose Role predates configmaps: Pods may be listed, ConfigMaps not."""

    namespace = "ns"

    async def list_pods(self, labels: dict[str, str]) -> list[dict[str, object]]:
        return []

    async def list_configmaps(self, labels: dict[str, str]) -> list[dict[str, object]]:
        raise SandboxError("kubernetes: list configmaps failed (403): forbidden")


async def test_kubernetes_a_refused_ca_sweep_does_not_stop_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api: Any = _RefusingConfigMaps()
    provider = KubernetesSandboxProvider(SandboxConfig(), KubernetesConfig(), instance="i", api=api)
    assert await provider.remove_orphans() == 0
    assert "could not sweep unused egress CA configmaps" in caplog.text
