"""``nproc`` inside a sandbox matches its CPU limit: each container gets a cpuset of that size."""

from __future__ import annotations

import os

import docker
import pytest

from dispatcher.sandbox.container.config import SandboxConfig
from tests.integration.conftest import ProviderFactory
from tests.integration.helpers import containers_of, run, runsc_available

pytestmark = pytest.mark.docker

HOST_CPUS = len(os.sched_getaffinity(0))
COUNT = "nproc; python3 -c 'import os; print(len(os.sched_getaffinity(0)))'"


@pytest.fixture(params=["runc", "runsc"])
def runtime(request: pytest.FixtureRequest, docker_client: docker.DockerClient) -> str | None:
    if request.param == "runsc" and not runsc_available(docker_client):
        pytest.skip("runsc is not registered with dockerd")
    return None if request.param == "runc" else "runsc"


@pytest.mark.skipif(HOST_CPUS < 2, reason="one CPU: the limit is the host's count anyway")
async def test_nproc_is_the_cpu_limit(make_provider: ProviderFactory, runtime: str | None) -> None:
    provider = make_provider(SandboxConfig(runtime=runtime))  # nano_cpus 1e9: one CPU
    ran = await run(provider.sandbox_for(make_provider.session()), COUNT)
    assert ran.result.exit_code == 0, ran.err
    assert ran.out.split() == ["1", "1"]


@pytest.mark.skipif(HOST_CPUS < 2, reason="one CPU: nothing to spread over")
async def test_successive_sandboxes_get_different_cpus(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    provider = make_provider()
    for name in ("a", "b"):
        ran = await run(provider.sandbox_for(make_provider.session(name)), "true")
        assert ran.result.exit_code == 0
    cpusets = sorted(
        c.attrs["HostConfig"]["CpusetCpus"] for c in containers_of(docker_client, provider.instance)
    )
    assert len(cpusets) == 2 and cpusets[0] != cpusets[1]


async def test_a_limit_of_every_cpu_pins_nothing(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(nano_cpus=HOST_CPUS * 1_000_000_000))
    ran = await run(provider.sandbox_for(make_provider.session()), COUNT)
    assert ran.out.split() == [str(HOST_CPUS)] * 2
