"""Fixtures for the tests against the stand-in Kubernetes API server (marker ``docker``).

One stand-in serves the whole pytest run; its containers carry ``kube-standin.instance`` with this
run's id, the server removes them when it stops, and a session finalizer sweeps whatever is left
with this run's label, so a failed test leaves no container behind. With
``DISPATCHER_REQUIRE_DOCKER=1`` (CI) a missing daemon or image fails loudly; otherwise those tests
are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.kube_standin import StandIn
from tests.kube_standin.runtime import LABEL_INSTANCE
from tests.kubernetes.backend_fixtures import KubeProviders
from tests.kubernetes.helpers import Kube, unavailable

RUN_ID = uuid.uuid4().hex[:8]
INSTANCE = f"kube-pytest-{RUN_ID}"
IMAGE = "dispatcher-sandbox:latest"
"""The sandbox image: the one image every machine that runs the docker tests has built."""
_counter = itertools.count()


def sweep(client: docker.DockerClient) -> None:
    """Force-remove every container this run's stand-in made."""
    for container in client.containers.list(
        all=True, filters={"label": f"{LABEL_INSTANCE}={INSTANCE}"}, ignore_removed=True
    ):
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)


@pytest.fixture(scope="session")
def kube_docker() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:
        unavailable(f"no Docker daemon answers ({type(exc).__name__}: {exc})")
        raise  # unreachable: unavailable always raises
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        unavailable(f"image {IMAGE} is missing (run `make images`)")
    yield client
    sweep(client)
    client.close()


@pytest.fixture(scope="session")
def standin(kube_docker: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIn]:
    server = StandIn(kube_docker, tmp_path_factory.mktemp("kube-standin"), instance=INSTANCE).start()
    try:
        yield server
    finally:
        server.stop()
        sweep(kube_docker)


@pytest.fixture
def namespace(standin: StandIn) -> str:
    """A namespace of its own for each test, so lists and watches see only that test's objects."""
    name = f"t{RUN_ID}-{next(_counter)}"
    standin.create_namespace(name)
    return name


@pytest.fixture
async def kube(standin: StandIn, namespace: str) -> AsyncIterator[Kube]:
    async with Kube.connect(standin, namespace) as client:
        yield client


@pytest.fixture
def kubeconfig(standin: StandIn, namespace: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig for the stand-in whose context's namespace is this test's own."""
    return standin.kubeconfig(tmp_path_factory.mktemp("kubeconfig") / "config", namespace=namespace)


@pytest.fixture
async def kube_providers(standin: StandIn, namespace: str, kubeconfig: Path) -> AsyncIterator[KubeProviders]:
    factory = KubeProviders(standin, namespace, kubeconfig, RUN_ID)
    try:
        yield factory
    finally:
        await factory.cleanup()
