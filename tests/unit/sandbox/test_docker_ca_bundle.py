"""A tenant's ``egress.ca_bundle`` in Docker sandboxes (fake daemon): mounted at ``CA_TARGET`` and
named to the agent's commands; a container adopted after a restart is told of it only if it has
the file; the launcher remembers nothing per container."""

from __future__ import annotations

from pathlib import Path

from dispatcher.egress.gate import CA_ENV_NAMES
from dispatcher.egress.proxy import TunnelStream
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
from dispatcher.sandbox.docker.launch import CA_TARGET
from tests.unit.sandbox.docker_rig import Rig, run
from tests.unit.sandbox.fake_containers import FakeContainer


class Gate:
    """The server's egress proxy as the backend sees it: a CA bundle, and connections never served."""

    def __init__(self, bundle: str | None) -> None:
        self.bundle = bundle

    def ca_bundle(self, tenant_id: str) -> str | None:
        return self.bundle

    async def serve(self, session_id: str, stream: TunnelStream, tool_use_id: str | None) -> None:
        await stream.close()


def _bundle(tmp: Path) -> str:
    path = tmp / "corp-ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\nnot checked here\n-----END CERTIFICATE-----\n")
    return str(path)


def _provider(rig: Rig, bundle: str | None) -> DockerSandboxProvider:
    provider = rig.provider()
    provider.egress = Gate(bundle)
    return provider


def _asked_for_the_file(container: FakeContainer) -> bool:
    return any(ex.cmd == ["test", "-f", CA_TARGET] for ex in container.execs)


async def test_a_container_made_with_the_bundle_names_it_without_asking(rig: Rig, tmp_path: Path) -> None:
    provider = _provider(rig, _bundle(tmp_path))
    assert (await run(provider.sandbox_for(rig.session()), "echo hi")).result.exit_code == 0
    (container,) = rig.fake.containers_alive
    mounts = container.spec["host_config"]["mounts"]
    assert any(m["Target"] == CA_TARGET and m["ReadOnly"] for m in mounts)
    assert container.tunnel_envs == [dict.fromkeys(CA_ENV_NAMES, CA_TARGET)]
    assert not _asked_for_the_file(container)


async def test_the_launcher_remembers_nothing_of_removed_containers(rig: Rig, tmp_path: Path) -> None:
    provider = _provider(rig, _bundle(tmp_path))
    made: list[str] = []
    for _ in range(3):
        session = rig.session()
        assert (await run(provider.sandbox_for(session), "echo hi")).result.exit_code == 0
        made += [c.id for c in rig.fake.containers_alive]
        await provider.close_session(session.session_id)
    assert len(set(made)) == 3 and not rig.fake.containers_alive
    held = repr(vars(provider.launcher))
    assert not any(container_id in held for container_id in made)
