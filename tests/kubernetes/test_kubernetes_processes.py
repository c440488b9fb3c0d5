"""A session's background processes on the Kubernetes backend: the agent is the Pod's process and
its attach stream outlives the server, so its table does too; a restarted server re-attaches at
the first process op and reads on from its cursor."""

from __future__ import annotations

import pytest

from dispatcher.core.process_api import ProcessStart
from tests.integration.helpers import run
from tests.kubernetes.backend_fixtures import KubeProviders

pytestmark = pytest.mark.docker


async def test_kubernetes_processes_survive_a_restarted_server(kube_providers: KubeProviders) -> None:
    instance = kube_providers.new_instance()
    first = kube_providers(instance=instance)
    session = kube_providers.session()
    sandbox = first.sandbox_for(session)
    table = sandbox.processes()
    started = await table.start(
        ProcessStart("p_tick", "i=0; while :; do echo tick $i; i=$((i+1)); sleep 0.05; done")
    )
    got = await table.read("p_tick", wait_seconds=5)
    cursor = got.next
    assert cursor > 0
    pod_name = sandbox.container_id
    assert pod_name is not None
    await first.detach_all()  # the server goes; the Pod and its agent stay

    second = kube_providers(instance=instance)
    second.expect_container(session, pod_name)
    assert await second.remove_orphans() == 0
    again = second.sandbox_for(session)
    records = {p.process_id: p for p in await again.processes().list()}  # re-attaches by itself
    assert again.container_id == pod_name
    assert records["p_tick"].pid == started.pid and records["p_tick"].running
    after = await again.processes().read("p_tick", after=cursor, wait_seconds=5)
    assert after.lost == 0 and after.chunks[0].cursor == cursor  # nothing missed meanwhile
    stopped = await again.processes().signal("p_tick", "TERM", grace_seconds=3)
    assert stopped.state == "killed"
    check = await run(again, f"kill -0 -{started.pid} 2>/dev/null && echo alive || echo gone")
    assert check.out == "gone\n"
