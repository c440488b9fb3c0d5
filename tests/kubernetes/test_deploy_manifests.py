"""deploy/kubernetes checked offline: every manifest against the Kubernetes OpenAPI schemas
(``kubernetes-validate`` ships them; the test forbids the network to prove it), and
``kubectl kustomize`` renders the set. No cluster and no Docker needed."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.kubernetes.helpers import unavailable

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.32"
"""The oldest release the manifests must suit (gRPC probes, Pod Security labels are older)."""
SANDBOX_NAMESPACE = "dispatcher-sandboxes"


def _documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs.extend(_documents(path.read_text(encoding="utf-8")))
    return docs


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection attempt fails the test: the schemas must come from the package."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network use while validating offline: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _name(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


@pytest.mark.parametrize("doc", _manifests(), ids=_name)
def test_kubernetes_manifest_matches_the_openapi_schema(doc: dict[str, Any], no_network: None) -> None:
    # strict: an unknown field (a typo) is an error, not silently dropped by the API server.
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kubernetes_manifests_are_what_the_issue_asks_for() -> None:
    kinds = {_name(doc) for doc in _manifests()}
    assert {
        "Namespace/dispatcher",
        f"Namespace/{SANDBOX_NAMESPACE}",
        "ServiceAccount/dispatcher",
        f"Role/{SANDBOX_NAMESPACE}",
        f"RoleBinding/{SANDBOX_NAMESPACE}",
        "StatefulSet/dispatcher",
        "Service/dispatcher",
        "NetworkPolicy/sandboxes-deny-all",
        "RuntimeClass/gvisor",
    } <= kinds
    by_name = {_name(doc): doc for doc in _manifests()}

    role = by_name[f"Role/{SANDBOX_NAMESPACE}"]
    assert role["metadata"]["namespace"] == SANDBOX_NAMESPACE
    granted = {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {
        ("", "pods"),
        ("", "pods/attach"),
        ("", "persistentvolumeclaims"),
        ("", "configmaps"),
        ("networking.k8s.io", "networkpolicies"),
    }
    assert all("*" not in rule["verbs"] for rule in role["rules"])

    policy = by_name["NetworkPolicy/sandboxes-deny-all"]["spec"]
    assert policy["podSelector"] == {} and sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in policy and "egress" not in policy  # no rule: nothing allowed

    statefulset = by_name["StatefulSet/dispatcher"]["spec"]
    (claim,) = statefulset["volumeClaimTemplates"]
    mounts = statefulset["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": claim["metadata"]["name"], "mountPath": "/var/lib/dispatcher"} in mounts


def test_kubernetes_kustomize_renders_the_set(no_network: None) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        unavailable("no kubectl on PATH (the machine image ships one; it embeds kustomize)")
        return
    # The monkeypatch covers this process only; kustomize of local files needs no network anyway.
    rendered = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60, check=True
    )
    docs = _documents(rendered.stdout)
    assert {_name(d) for d in docs} == {_name(d) for d in _manifests() if d["kind"] != "RuntimeClass"}
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "dispatcher"
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kubernetes_configmap_is_a_valid_server_config(tmp_path: Path) -> None:
    """The ConfigMap's config.yaml loads as serve would load it, with the Kubernetes backend."""
    from dispatcher.config.load import load_config

    (configmap,) = [d for d in _manifests() if d["kind"] == "ConfigMap"]
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    config = load_config(path, home=str(tmp_path / "home"))
    assert config.sandbox_backend == "kubernetes"
    assert config.kubernetes.namespace == SANDBOX_NAMESPACE and config.kubernetes.kubeconfig is None
