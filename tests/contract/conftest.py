"""``target``: each test of the contract runs once per sandbox (``targets.py``).

The real-daemon targets reuse the fixtures that make and clean up Docker providers and the stand-in
Kubernetes API (tests/integration, tests/kubernetes): every container they make is labelled with
this run's id and removed in teardown, even on failure; without a daemon or the image they are
skipped with the reason (failed under ``DISPATCHER_REQUIRE_DOCKER=1``), as there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.contract import targets
from tests.contract.targets import REAL_DAEMON, Target
from tests.integration.conftest import ProviderFactory, docker_client, make_provider
from tests.kubernetes.backend_fixtures import KubeProviders
from tests.kubernetes.conftest import kube_docker, kube_providers, kubeconfig, namespace, standin
from tests.unit.sandbox.docker_rig import Rig, rig

__all__ = [
    "docker_client",
    "kube_docker",
    "kube_providers",
    "kubeconfig",
    "make_provider",
    "namespace",
    "rig",
    "standin",
]


@pytest.fixture(
    params=[pytest.param(n, marks=pytest.mark.docker) if n in REAL_DAEMON else n for n in targets.NAMES]
)
def target_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def backing(request: pytest.FixtureRequest, target_name: str) -> object:
    """What the target is made over, resolved only for the targets that need it (synchronous:
    a fixture's asynchronous setup cannot start from inside another's)."""
    needs = {"fake-docker": "rig", "docker": "make_provider", "kubernetes": "kube_providers"}
    return request.getfixturevalue(needs[target_name]) if target_name in needs else None


@pytest.fixture
async def target(target_name: str, backing: object, tmp_path: Path) -> AsyncIterator[Target]:
    if target_name == "fake":
        yield targets.fake()
    elif target_name == "local":
        workspace = tmp_path / "ws"
        workspace.mkdir()
        async with targets.local(workspace) as local:
            yield local
    elif target_name == "fake-docker":
        assert isinstance(backing, Rig)
        yield targets.fake_docker(backing)
    elif target_name == "docker":
        assert isinstance(backing, ProviderFactory)
        yield targets.docker(backing)
    else:
        assert isinstance(backing, KubeProviders)
        yield targets.kubernetes(backing)
