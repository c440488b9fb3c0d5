"""What the Kubernetes backend creates, checked without a cluster: the Pod carries every hardening
setting, grants become mounts, the PVC and policy are what the README says, the config section
validates like every other, and ``config-check --show-pod`` prints exactly the backend's Pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cli import main
from dispatcher.core.capabilities import Capabilities, FsGrant
from dispatcher.core.errors import ConfigError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.container.labels import LABEL_INSTANCE, LABEL_SESSION, LABEL_TENANT
from dispatcher.sandbox.kubernetes.manifests import (
    label_value,
    network_policy_manifest,
    pod_manifest,
    pod_name,
    pvc_manifest,
    pvc_name,
)

KUBE = KubernetesConfig(namespace="sandboxes")


def session(**kw: Any) -> Session:
    base: dict[str, Any] = {
        "session_id": "ses_1",
        "workspace_path": "/w/t/proj",
        "tenant_id": "acme",
        "workspace_root": "/w/t",
        "workspace_name": "proj",
        "sandbox_uid": 200_001,
        "sandbox_gid": 200_002,
    }
    return Session(**{**base, **kw})


def test_kubernetes_pod_carries_every_hardening_setting() -> None:
    kube = KubernetesConfig(
        namespace="sandboxes",
        runtime_class_name="gvisor",
        node_selector={"pool": "sandboxes"},
        image_pull_secrets=("regcred",),
        pod_annotations={"example.com/team": "ai"},
    )
    config = SandboxConfig(mem_limit=1 << 30, nano_cpus=1_500_000_000, tmpfs_size="64m")
    pod = pod_manifest(config, kube, session(), instance="inst", name="p")
    spec = pod["spec"]
    (container,) = spec["containers"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 200_001
    assert security["runAsGroup"] == 200_002 and spec["securityContext"]["fsGroup"] == 200_002
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert container["resources"]["limits"] == {"cpu": "1500m", "memory": "1Gi", "ephemeral-storage": "1Gi"}
    assert {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}} in spec["volumes"]
    assert spec["runtimeClassName"] == "gvisor" and spec["nodeSelector"] == {"pool": "sandboxes"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["metadata"]["annotations"]["example.com/team"] == "ai"
    assert container["stdin"] is True and container["stdinOnce"] is False and container["tty"] is False
    assert container["command"][:3] == ["python3", "-I", "/opt/dispatcher/agent.pyz"]
    assert "ports" not in container and spec["restartPolicy"] == "Never"
    assert spec["shareProcessNamespace"] is True  # pid 1 reaps what commands orphan
    labels = pod["metadata"]["labels"]
    assert (labels[LABEL_SESSION], labels[LABEL_TENANT], labels[LABEL_INSTANCE]) == ("ses_1", "acme", "inst")


def test_kubernetes_pod_refuses_a_named_user() -> None:
    with pytest.raises(ConfigError, match="numeric"):
        pod_manifest(SandboxConfig(user="sandbox"), KUBE, session(sandbox_uid=None), instance="i", name="p")


def test_kubernetes_grants_are_mounts_of_the_workspace_claim() -> None:
    caps = Capabilities(fs_grants=(FsGrant("src", "rw"), FsGrant("docs", "r")))
    pod = pod_manifest(SandboxConfig(), KUBE, session(capabilities=caps), instance="i", name="p")
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/workspace"]["name"] == "empty-root" and mounts["/workspace"]["readOnly"] is True
    assert mounts["/workspace/src"] == {
        "name": "workspace",
        "mountPath": "/workspace/src",
        "subPath": "src",
        "readOnly": False,
    }
    assert mounts["/workspace/docs"]["readOnly"] is True
    assert "--grants" in pod["spec"]["containers"][0]["command"]


def test_kubernetes_pvc_is_per_workspace_and_sized_by_the_quota() -> None:
    kube = KubernetesConfig(namespace="sandboxes", storage_class="fast", access_mode="ReadWriteMany")
    claim = pvc_manifest(SandboxConfig.model_validate({"workspace_quota": "2g"}), kube, session())
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "2Gi"}},
        "storageClassName": "fast",
    }
    assert pvc_name(session(session_id="other")) == claim["metadata"]["name"]  # shared by sessions
    assert pvc_name(session(workspace_name="other")) != claim["metadata"]["name"]
    assert pvc_name(session(tenant_id="rival")) != claim["metadata"]["name"]
    policy = network_policy_manifest("sandboxes")["spec"]
    assert policy == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_kubernetes_names_and_label_values_are_what_the_api_accepts() -> None:
    name = pod_name("Instance_With.Odd", "ses_ABC/def")
    assert len(name) <= 63 and name == name.lower() and "_" not in name and "/" not in name
    assert pod_name("i", "s") != pod_name("i", "s")  # a recreated sandbox gets a new Pod
    assert label_value("ses_1") == "ses_1"
    long = "t" * 64
    assert label_value(long) == label_value(long) and len(label_value(long)) <= 63


def config_file(tmp_path: Path, sandbox: dict[str, Any]) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), "sandbox": sandbox}))
    return path


def test_kubernetes_config_check_validates_and_shows_the_pod(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = config_file(
        tmp_path,
        {
            "backend": "kubernetes",
            "instance": "inst",
            "kubernetes": {
                "namespace": "sandboxes",
                "tolerations": [{"key": "sandbox", "operator": "Exists"}],
            },
        },
    )
    assert main(["config-check", str(good), "--show-pod"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["Pod", "PersistentVolumeClaim", "NetworkPolicy"]
    pod = docs[0]
    assert pod["metadata"]["namespace"] == "sandboxes"
    assert pod["spec"]["tolerations"] == [{"operator": "Exists", "key": "sandbox"}]
    expected = pod_manifest(
        SandboxConfig(instance="inst"),
        KubernetesConfig(namespace="sandboxes", tolerations=({"key": "sandbox", "operator": "Exists"},)),  # type: ignore[arg-type]
        Session(
            "example-session",
            str(tmp_path / "home/workspaces/example"),
            workspace_root=str(tmp_path / "home/workspaces"),
            workspace_name="example",
        ),
        instance="inst",
        name=pod["metadata"]["name"],
    )
    assert pod == expected  # the backend's own Pod, not a description of it

    for sandbox, message in (
        ({"backend": "kubernetes", "runtime": "runsc"}, "sandbox.runtime: only the docker backend"),
        # No per-Pod process limit exists: the key is refused, naming what bounds a Pod instead.
        ({"backend": "kubernetes", "pids_limit": 64}, "the kubelet's podPidsLimit (node configuration)"),
        ({"backend": "docker", "kubernetes": {}}, "sandbox.kubernetes: only with backend: kubernetes"),
        ({"backend": "kubernetes", "kubernetes": {"namespace": "Bad_NS"}}, "sandbox.kubernetes.namespace"),
        ({"backend": "kubernetes", "kubernetes": {"bogus": 1}}, "sandbox.kubernetes.bogus"),
    ):
        assert main(["config-check", str(config_file(tmp_path, sandbox))]) == 2
        assert message in capsys.readouterr().err
