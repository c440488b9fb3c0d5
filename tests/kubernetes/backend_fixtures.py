"""Providers of the Kubernetes sandbox backend against the stand-in, and what tests look at."""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.kubernetes.backend import KubernetesSandboxProvider
from dispatcher.sandbox.kubernetes.manifests import pvc_name
from tests.kube_standin import StandIn
from tests.kube_standin.podspec import pvc_dir

_counter = itertools.count()
IMAGE = os.environ.get("DISPATCHER_KUBE_TEST_IMAGE", "dispatcher-sandbox:latest")
"""The sandbox image the backend's Pods run (an override tests an agent not yet in the shared image)."""


@dataclass
class KubeProviders:
    """Makes providers (unique instance labels) in one namespace and closes them afterwards."""

    standin: StandIn
    namespace: str
    kubeconfig: Path
    run_id: str
    providers: list[KubernetesSandboxProvider] = field(default_factory=list)

    def new_instance(self) -> str:
        return f"kb-{self.run_id}-{next(_counter)}"

    def kube(self, **kw: object) -> KubernetesConfig:
        return KubernetesConfig.model_validate(
            {"namespace": self.namespace, "kubeconfig": str(self.kubeconfig), **kw}
        )

    def __call__(
        self, config: SandboxConfig | None = None, *, instance: str | None = None, **kube: object
    ) -> KubernetesSandboxProvider:
        provider = KubernetesSandboxProvider(
            config or SandboxConfig(image=IMAGE), self.kube(**kube), instance=instance or self.new_instance()
        )
        self.providers.append(provider)
        return provider

    @staticmethod
    def session(name: str = "s", *, tenant: str = "tenant-a") -> Session:
        session_id = f"{name}-{uuid.uuid4().hex[:8]}"
        return Session(
            session_id=session_id,
            workspace_path=f"/nonexistent/{session_id}",
            tenant_id=tenant,
            workspace_root="/nonexistent",
            workspace_name=session_id,
        )

    def workspace(self, session: Session) -> Path:
        """Where the stand-in keeps the session's workspace PVC on this host."""
        return pvc_dir(self.standin.state_dir, self.namespace, pvc_name(session))

    async def cleanup(self) -> None:
        for provider in self.providers:
            with contextlib.suppress(Exception):
                await provider.aclose()
