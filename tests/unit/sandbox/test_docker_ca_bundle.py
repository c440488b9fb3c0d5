"""A tenant's ``egress.ca_bundle`` in Docker sandboxes (fake daemon): mounted at ``CA_TARGET`` and
named to the agent's commands; a container adopted after a restart is told of it only if it has
the file; the launcher remembers nothing per container."""

from __future__ import annotations

from pathlib import Path

from dispatcher.egress.gate import CA_ENV_NAMES
from dispatcher.egress.proxy import TunnelStream
from dispatcher.sandbox.container.config import CA_TARGET
from dispatcher.sandbox.docker.backend import DockerSandboxProvider
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


async def _made_then_adopted(rig: Rig, *, made_with: str | None, adopted_with: str | None) -> FakeContainer:
    """A session's container made by one server, then adopted by the next (same instance)."""
    first = _provider(rig, made_with)
    session = rig.session()
    sandbox = first.sandbox_for(session)
    assert (await run(sandbox, "echo made")).result.exit_code == 0
    (container,) = rig.fake.containers_alive
    await first.detach_all()  # a graceful stop that keeps the session's container

    second = _provider(rig, adopted_with)
    second.expect_container(session, container.id)
    await second.remove_orphans()
    await second.adopt_all()
    assert len(container.tunnel_envs) == 2, "the second server's agent listens too"
    assert (await run(second.sandbox_for(session), "echo adopted")).result.exit_code == 0
    return container


async def test_a_container_made_with_the_bundle_names_it_without_asking(rig: Rig, tmp_path: Path) -> None:
    provider = _provider(rig, _bundle(tmp_path))
    assert (await run(provider.sandbox_for(rig.session()), "echo hi")).result.exit_code == 0
    (container,) = rig.fake.containers_alive
    mounts = container.spec["host_config"]["mounts"]
    assert any(m["Target"] == CA_TARGET and m["ReadOnly"] for m in mounts)
    assert container.tunnel_envs == [dict.fromkeys(CA_ENV_NAMES, CA_TARGET)]
    assert not _asked_for_the_file(container)


async def test_an_adopted_container_with_the_bundle_is_told_of_it(rig: Rig, tmp_path: Path) -> None:
    bundle = _bundle(tmp_path)
    container = await _made_then_adopted(rig, made_with=bundle, adopted_with=bundle)
    assert container.tunnel_envs[1] == dict.fromkeys(CA_ENV_NAMES, CA_TARGET)
    assert _asked_for_the_file(container)


async def test_an_adopted_container_made_before_the_bundle_is_not_pointed_at_a_missing_file(
    rig: Rig, tmp_path: Path
) -> None:
    # The tenant got a ca_bundle across the restart: the container has no file at CA_TARGET, and
    # variables naming it would break every TLS client in it.
    container = await _made_then_adopted(rig, made_with=None, adopted_with=_bundle(tmp_path))
    assert container.tunnel_envs == [{}, {}]
    assert _asked_for_the_file(container)


async def test_an_adopted_container_is_not_asked_when_the_tenant_has_no_bundle(
    rig: Rig, tmp_path: Path
) -> None:
    container = await _made_then_adopted(rig, made_with=_bundle(tmp_path), adopted_with=None)
    assert container.tunnel_envs[1] == {}
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
