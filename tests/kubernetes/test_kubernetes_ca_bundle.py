"""A tenant's egress CA bundle in its Pods (against the stand-in): one immutable ConfigMap per
instance and bundle, mounted read-only at the Docker backend's path, the five variables naming it
in commands, kept across a restart while a Pod mounts it and deleted at a start once none does."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.egress.gate import CA_ENV_NAMES
from dispatcher.egress.proxy import TunnelStream
from dispatcher.sandbox.container.config import CA_TARGET
from dispatcher.sandbox.container.labels import LABEL_INSTANCE
from dispatcher.sandbox.kubernetes.ca import CA_KEY, CA_VOLUME, LABEL_CA, configmap_name
from tests.integration.helpers import run
from tests.kubernetes.backend_fixtures import KubeProviders
from tests.kubernetes.helpers import Kube

pytestmark = pytest.mark.docker

BUNDLE = "-----BEGIN CERTIFICATE-----\nMIIBexample\n-----END CERTIFICATE-----\n"
SHOW = (
    "env | grep -E '^("
    + "|".join(CA_ENV_NAMES)
    + ')=\' | sort; cat "$SSL_CERT_FILE"; '
    + (f"echo x 2>&1 > {CA_TARGET} | tail -c 25")
)


class CaGate:
    """An egress proxy stand-in whose tenants trust ``bundle`` (it serves no connection)."""

    def __init__(self, bundle: Path | None) -> None:
        self.bundle = bundle

    def ca_bundle(self, tenant_id: str) -> str | None:
        return str(self.bundle) if self.bundle is not None else None

    async def serve(self, session_id: str, stream: TunnelStream, tool_use_id: str | None) -> None:
        await stream.close()


async def configmaps(kube: Kube, instance: str) -> list[str]:
    return await kube.names("configmaps", f"{LABEL_INSTANCE}={instance},{LABEL_CA}=true")


async def test_kubernetes_ca_bundle_is_a_configmap_mounted_read_only_with_its_variables(
    kube_providers: KubeProviders, kube: Kube, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text(BUNDLE)
    instance = kube_providers.new_instance()
    first = kube_providers(instance=instance)
    first.egress = CaGate(bundle)
    session, other = kube_providers.session("a"), kube_providers.session("b")
    sandbox = first.sandbox_for(session)
    out = (await run(sandbox, SHOW)).out
    assert [f"{name}={CA_TARGET}" for name in sorted(CA_ENV_NAMES)] == out.splitlines()[:5]
    assert BUNDLE in out and "Read-only file system" in out

    name = configmap_name(instance, BUNDLE.encode())
    assert await configmaps(kube, instance) == [name]
    made = await kube.get("configmaps", name)
    assert made["immutable"] is True and made["data"] == {CA_KEY: BUNDLE}
    spec = (await kube.get("pods", sandbox.container_id or ""))["spec"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == CA_VOLUME]
    assert volume["configMap"]["name"] == name
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == CA_VOLUME]
    assert mount == {"name": CA_VOLUME, "mountPath": CA_TARGET, "subPath": CA_KEY, "readOnly": True}

    # A second session of the tenant mounts the same ConfigMap (made once).
    await run(first.sandbox_for(other), "true")
    assert await configmaps(kube, instance) == [name]

    # A restart: the Pods stay, so does their ConfigMap; the re-attached agent names it again.
    pod = sandbox.container_id
    assert pod is not None
    await first.detach_all()
    second = kube_providers(instance=instance)
    second.egress = CaGate(bundle)
    second.expect_container(session, pod)
    await second.remove_orphans()  # the other session is not live here: its Pod goes
    await second.adopt_all()
    again = second.sandbox_for(session)
    assert again.container_id == pod
    assert BUNDLE in (await run(again, SHOW)).out
    assert await configmaps(kube, instance) == [name]

    # Once no Pod mounts it, the next start deletes it.
    await second.close_session(session.session_id)
    await kube.wait_gone(pod, timeout=30)
    await second.detach_all()
    third = kube_providers(instance=instance)
    await third.remove_orphans()
    assert await configmaps(kube, instance) == []


async def test_kubernetes_ca_bundle_changed_or_too_big(
    kube_providers: KubeProviders, kube: Kube, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text(BUNDLE)
    provider = kube_providers()
    provider.egress = CaGate(bundle)
    await run(provider.sandbox_for(kube_providers.session()), "true")
    bundle.write_text(BUNDLE + BUNDLE)  # a new bundle: a new ConfigMap for the next Pod
    assert BUNDLE + BUNDLE in (await run(provider.sandbox_for(kube_providers.session()), SHOW)).out
    assert len(await configmaps(kube, provider.instance)) == 2

    bundle.write_bytes(b"x" * (1 << 20))
    with pytest.raises(SandboxError, match="larger than a ConfigMap holds"):
        await run(provider.sandbox_for(kube_providers.session()), "true")
