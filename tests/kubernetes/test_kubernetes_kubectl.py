"""A real kubectl against the stand-in, so the stand-in answers what a real client expects.

Two kubectls: the machine image's (1.32, on PATH), which attaches over WebSocket — it must list,
get and attach; and Debian's ``kubernetes-client`` (1.20, unpacked by
scripts/ensure-kubectl-debian.sh), which attaches over SPDY only — it must list and get, and its
attach must fail with the stand-in's clear refusal (the stand-in does not implement SPDY; a real
API server would, so that one gap is pinned here rather than skipped).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.kube_standin import StandIn
from tests.kubernetes.helpers import pod, unavailable
from tests.polling import until_sync

pytestmark = pytest.mark.docker

DEBIAN_KUBECTL = Path(os.environ.get("KUBECTL_DEBIAN_DIR", "/opt/kubectl-debian")) / "usr/bin/kubectl"


def _minor(kubectl: str) -> int:
    out = subprocess.run(
        [kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
    )
    return int(json.loads(out.stdout)["clientVersion"]["minor"].rstrip("+"))


@pytest.fixture(scope="module")
def kubectl() -> str:
    """The machine's kubectl; 1.30 or later, so it attaches over WebSocket."""
    found = shutil.which("kubectl")
    if found is None:
        unavailable("no kubectl on PATH (the machine image ships one)")
        raise AssertionError  # unreachable
    if _minor(found) < 30:
        unavailable(f"{found} is older than 1.30 and attaches over SPDY only")
    return found


@pytest.fixture(scope="module")
def debian_kubectl() -> str:
    if not DEBIAN_KUBECTL.exists():
        unavailable(f"{DEBIAN_KUBECTL} is missing (bash scripts/ensure-kubectl-debian.sh)")
    return str(DEBIAN_KUBECTL)


class Kubectl:
    def __init__(self, binary: str, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result

    def create_pod(self, tmp_path: Path, body: dict[str, object]) -> None:
        path = tmp_path / f"{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(body))
        # --validate=false: client-side validation downloads the OpenAPI document, not modelled.
        self("create", "--validate=false", "-f", str(path))

    def wait_phase(self, name: str, phase: str) -> None:
        until_sync(
            lambda: self("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout == phase,
            f"pod {name} {phase}",
            timeout=60,
            interval=0.2,
        )


def test_kubernetes_kubectl_lists_gets_and_attaches(
    kubectl: str, standin: StandIn, namespace: str, tmp_path: Path
) -> None:
    k = Kubectl(kubectl, standin.kubeconfig(tmp_path / "kubeconfig", namespace=namespace))
    session = f"s-{uuid.uuid4().hex[:8]}"
    k.create_pod(
        tmp_path, pod("cat", ["cat"], labels={"dispatcher.session": session}, stdin=True, stdinOnce=True)
    )
    k.create_pod(tmp_path, pod("other", ["sleep", "60"], labels={"dispatcher.session": "someone-else"}))
    k.wait_phase("cat", "Running")

    assert k("get", "pods", "-l", f"dispatcher.session={session}", "-o", "name").stdout.split() == ["pod/cat"]
    table = k("get", "pods", "-l", f"dispatcher.session in ({session})").stdout
    assert "cat" in table and "Running" in table and "other" not in table

    got = json.loads(k("get", "pod", "cat", "-o", "json").stdout)
    assert got["metadata"]["labels"] == {"dispatcher.session": session}
    assert got["status"]["phase"] == "Running"

    # kubectl sends the line, then (v5) closes stdin when its own stdin ends: cat echoes and exits.
    attached = k("attach", "-i", "cat", stdin="hello from kubectl\n")
    assert "hello from kubectl" in attached.stdout
    k.wait_phase("cat", "Succeeded")

    k("delete", "pod", "other", "--grace-period=1")
    assert k("get", "pods", "-o", "name").stdout.split() == ["pod/cat"]


def test_kubernetes_kubectl_is_refused_without_the_token(
    kubectl: str, standin: StandIn, tmp_path: Path
) -> None:
    k = Kubectl(kubectl, standin.kubeconfig(tmp_path / "kubeconfig", token="not-the-token"))
    result = k("get", "pods", check=False)
    assert result.returncode != 0
    assert "You must be logged in to the server" in result.stderr


def test_kubernetes_debian_kubectl_lists_and_gets_but_cannot_attach_over_spdy(
    debian_kubectl: str, standin: StandIn, namespace: str, tmp_path: Path
) -> None:
    k = Kubectl(debian_kubectl, standin.kubeconfig(tmp_path / "kubeconfig", namespace=namespace))
    assert _minor(debian_kubectl) == 20
    k.create_pod(tmp_path, pod("cat", ["cat"], labels={"app": "old-client"}, stdin=True))
    k.wait_phase("cat", "Running")
    assert k("get", "pods", "-l", "app=old-client", "-o", "name").stdout.split() == ["pod/cat"]
    assert json.loads(k("get", "pod", "cat", "-o", "json").stdout)["status"]["phase"] == "Running"

    refused = k("attach", "-i", "cat", stdin="hi\n", check=False)
    assert refused.returncode != 0
    assert "SPDY upgrade refused" in refused.stderr
