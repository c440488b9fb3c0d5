"""ConfigMaps in the stand-in, held to the real API server's semantics: create (201), the same name
again (409 AlreadyExists), keys and size checked (422), undecodable bodies (400), delete answered
by a Status; a Pod's ``configMap`` volume mounted read-only, its Pod waiting in
``ContainerCreating`` until the ConfigMap exists; and both kubectls reading them."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
from pathlib import Path

import docker
import pytest

from tests.kube_standin import StandIn
from tests.kube_standin.runtime import LABEL_UID
from tests.kubernetes.helpers import Kube, Obj, pod, unavailable
from tests.kubernetes.test_kubernetes_kubectl import DEBIAN_KUBECTL
from tests.polling import until

pytestmark = pytest.mark.docker


def configmap(name: str, **content: object) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, **content}


async def test_kubernetes_configmap_verbs_and_errors_are_the_api_servers(kube: Kube) -> None:
    made = await kube.create("configmaps", configmap("ca", data={"ca.crt": "PEM"}, immutable=True))
    assert made["kind"] == "ConfigMap" and made["immutable"] is True and made["metadata"]["uid"]
    status, again = await kube.request("POST", kube.url("configmaps"), json=configmap("ca", data={}))
    assert (status, again["reason"], again["details"]["kind"]) == (409, "AlreadyExists", "configmaps")
    assert (await kube.get("configmaps", "ca"))["data"] == {"ca.crt": "PEM"}

    bad_keys = configmap("keys", data={"a/b": "x", "ok": "y"}, binaryData={"ok": "eQ=="})
    status, body = await kube.request("POST", kube.url("configmaps"), json=bad_keys)
    assert (status, body["reason"]) == (422, "Invalid")
    assert {c["field"] for c in body["details"]["causes"]} == {"data[a/b]", "data[ok]"}
    big = configmap("big", data={"k": "x" * (1 << 20)})
    raw = io.BytesIO(json.dumps(big).encode())  # a body this big is streamed, not sent at once
    headers = {"Content-Type": "application/json"}
    status, body = await kube.request("POST", kube.url("configmaps"), data=raw, headers=headers)
    assert (status, body["details"]["causes"][0]["field"]) == (422, "data")
    assert "at most 1048576 bytes" in body["message"]
    status, body = await kube.request(
        "POST", kube.url("configmaps"), json=configmap("b64", binaryData={"k": "not base64!"})
    )
    assert (status, body["reason"]) == (400, "BadRequest")

    status, gone = await kube.request("DELETE", kube.url("configmaps", "ca"))
    assert (status, gone["kind"], gone["status"]) == (200, "Status", "Success")
    assert gone["details"] == {"name": "ca", "kind": "configmaps", "uid": made["metadata"]["uid"]}
    status, _ = await kube.request("GET", kube.url("configmaps", "ca"))
    assert status == 404


async def test_kubernetes_configmap_volume_waits_for_its_configmap_then_mounts_read_only(
    kube: Kube,
) -> None:
    body = pod(
        "reader",
        [
            "sh",
            "-c",
            "ls -l /etc/ca/bundle.pem; cat /etc/ca/bundle.pem; echo; echo x > /etc/ca/bundle.pem; sleep 60",
        ],
        volumeMounts=[{"name": "ca", "mountPath": "/etc/ca/bundle.pem", "subPath": "bundle.pem"}],
    )
    body["spec"]["volumes"] = [
        {
            "name": "ca",
            "configMap": {
                "name": "later",
                "items": [{"key": "k", "path": "bundle.pem"}],
                "defaultMode": 0o444,
            },
        }
    ]
    created = await kube.create("pods", body)
    # Nothing to mount yet: the Pod is not started (the kubelet retries its FailedMount).
    assert (await kube.get("pods", "reader"))["status"]["phase"] == "Pending"
    await kube.create(
        "configmaps", configmap("later", binaryData={"k": base64.b64encode(b"\x00BUNDLE").decode()})
    )
    await kube.wait_phase("reader", "Running")
    logs = await _logs_until(kube, created, b"BUNDLE")
    assert b"-r--r--r--" in logs and b"\x00BUNDLE" in logs
    assert b"Read-only file system" in logs  # mounted read-only although the mount did not say so

    bad = pod("bad", ["true"])
    bad["spec"]["volumes"] = [{"name": "v", "configMap": {"defaultMode": 0o1777}, "emptyDir": {}}]
    status, answer = await kube.request("POST", kube.url("pods"), json=bad)
    assert (status, answer["reason"]) == (422, "Invalid")
    assert "spec.volumes[0]" in {c["field"] for c in answer["details"]["causes"]}


async def test_kubernetes_deleting_a_pod_that_waits_for_its_configmap(kube: Kube) -> None:
    body = pod("waiting", ["true"], volumeMounts=[{"name": "ca", "mountPath": "/etc/ca"}])
    body["spec"]["volumes"] = [{"name": "ca", "configMap": {"name": "never"}}]
    await kube.create("pods", body)
    await kube.delete("pods", "waiting")
    await kube.wait_gone("waiting", timeout=30)
    await kube.create("configmaps", configmap("never", data={"k": "v"}))  # wakes nothing up any more


async def _logs_until(kube: Kube, obj: Obj, marker: bytes) -> bytes:
    client = docker.from_env()
    seen = b""

    async def shown() -> bool:
        nonlocal seen
        (found,) = client.containers.list(
            all=True, filters={"label": f"{LABEL_UID}={obj['metadata']['uid']}"}
        )
        seen = found.logs()
        return marker in seen and b"file system" in seen

    try:
        await until(shown, "the pod's output", timeout=30)
    finally:
        client.close()
    return seen


@pytest.mark.parametrize("which", ["machine", "debian"])
def test_kubernetes_kubectl_reads_configmaps(
    standin: StandIn, namespace: str, tmp_path: Path, which: str
) -> None:
    binary = shutil.which("kubectl") if which == "machine" else str(DEBIAN_KUBECTL)
    if binary is None or not Path(binary).exists():
        unavailable(f"no {which} kubectl")
    kubeconfig = standin.kubeconfig(tmp_path / "kubeconfig", namespace=namespace)

    def kc(*args: str) -> str:
        done = subprocess.run(
            [str(binary), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    made = tmp_path / "bundle.json"
    body = configmap("bundle", data={"ca.crt": "PEM"}, immutable=True)
    body["metadata"]["labels"] = {"app": "x"}
    made.write_text(json.dumps(body))
    kc("create", "--validate=false", "-f", str(made))  # the OpenAPI document is not modelled
    assert kc("get", "configmaps", "-l", "app=x", "-o", "name").split() == ["configmap/bundle"]
    assert json.loads(kc("get", "cm", "bundle", "-o", "json"))["data"] == {"ca.crt": "PEM"}
    table = kc("get", "configmaps")
    assert "bundle" in table and "DATA" in table
