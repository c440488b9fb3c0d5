"""The five sandboxes the contract holds to one behaviour, and what each declares it cannot do.

The one module of the suite that names sandbox implementations: the tests see a ``Target`` (a
``Sandbox`` plus its declarations) and nothing else, so a backend renamed or moved is one edit here.

A target that legitimately lacks something says so in ``lacks`` with the reason; a test that needs
it asks ``require`` (skipped, naming the declaration) or branches on ``has`` to check the declared
behaviour instead. Nothing is probed.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pytest

from dispatcher.core.sandbox_api import ExecRequest, Sandbox
from dispatcher.sandbox.fake import FakeSandbox
from dispatcher.sandbox.local import LocalSandbox
from tests.contract.real_agent import run_real_agent
from tests.integration.conftest import ProviderFactory
from tests.kubernetes.backend_fixtures import KubeProviders
from tests.unit.sandbox.docker_rig import Rig


class Capability(StrEnum):
    """What a sandbox may lack, for a reason stated where the target is made."""

    COMMANDS = "commands"
    """``exec`` runs ``sh -c command`` in a process group of its own."""
    ISOLATION = "isolation"
    """Commands see nothing of the host but the workspace."""
    ROOT_PATHS = "root_paths"
    """An absolute path under ``workspace_root`` reaches the workspace where commands run."""
    PROCESSES = "processes"
    """``processes()`` is a table of background processes (``core.process_api``)."""
    PORTS = "ports"
    """``connect_port`` reaches a TCP port of the sandbox's loopback (``core.sandbox_api.PortStream``)."""


NAMES = ("fake", "local", "fake-docker", "docker", "kubernetes")
REAL_DAEMON = frozenset({"docker", "kubernetes"})
"""Targets that need a Docker daemon and the sandbox image (marker ``docker``)."""


@dataclass
class Target:
    """One sandbox under test."""

    name: str
    sandbox: Sandbox
    make_link: Callable[[str, str], Awaitable[None]]
    lacks: Mapping[Capability, str] = field(default_factory=dict)

    def has(self, capability: Capability) -> bool:
        return capability not in self.lacks

    def require(self, capability: Capability) -> None:
        """Skip the test, naming the declaration, when this target lacks ``capability``."""
        if capability in self.lacks:
            pytest.skip(f"{self.name} declares no {capability}: {self.lacks[capability]}")

    async def link(self, link: str, target: str) -> None:
        """A symbolic link at ``link`` (workspace-relative) storing ``target``, as ``ln -s`` makes it."""
        await self.make_link(link, target)

    def path(self, rel: str) -> str:
        """``rel`` as an absolute path under the sandbox's workspace root."""
        return f"{self.sandbox.workspace_root.rstrip('/')}/{rel}"


async def _ln_s(sandbox: Sandbox, link: str, target: str) -> None:
    quoted = " ".join("'" + arg.replace("'", "'\\''") + "'" for arg in (target, link))
    result = await sandbox.exec(ExecRequest(f"ln -s {quoted}", timeout=30), lambda *_: None, asyncio.Event())
    assert result.exit_code == 0, f"ln -s {target} {link} failed: {result}"


def _with_ln(name: str, sandbox: Sandbox, lacks: Mapping[Capability, str] | None = None) -> Target:
    async def make_link(link: str, target: str) -> None:
        await _ln_s(sandbox, link, target)

    return Target(name, sandbox, make_link, dict(lacks or {}))


def fake() -> Target:
    sandbox = FakeSandbox()

    async def make_link(link: str, target: str) -> None:
        sandbox.links[link] = target

    lacks = {
        Capability.COMMANDS: "its exec runs the callable a test gives it (exec_handler), not a shell",
        Capability.PROCESSES: "its process table runs no command: the test drives its output and exit (sandbox/fake/processes.py)",
        Capability.PORTS: "it has no agent and no loopback: connect_port raises PortError('unsupported')",
    }
    return Target("fake", sandbox, make_link, lacks)


@asynccontextmanager
async def local(workspace: Path) -> AsyncIterator[Target]:
    sandbox = LocalSandbox(str(workspace), kill_wait=1.0)
    try:
        yield _with_ln(
            "local", sandbox, {Capability.ISOLATION: "commands run on the host as the server's user"}
        )
    finally:
        await sandbox.aclose()


FAKE_DAEMON_LACKS = {
    Capability.ISOLATION: "the fake daemon runs the agent's commands on the host",
    Capability.ROOT_PATHS: "the fake daemon has no mount namespace: the agent's root is the host directory",
}


def fake_docker(rig: Rig) -> Target:
    rig.fake.agent_program = run_real_agent
    # A real agent starts in ~0.1 s, slower on a loaded machine than the scripted one.
    sandbox = rig.sandbox(agent_start_timeout=30.0, op_timeout_seconds=30.0)
    return _with_ln("fake-docker", sandbox, FAKE_DAEMON_LACKS)


def docker(make_provider: ProviderFactory) -> Target:
    provider = make_provider()
    return _with_ln("docker", provider.sandbox_for(make_provider.session("contract")))


def kubernetes(kube_providers: KubeProviders) -> Target:
    provider = kube_providers()
    return _with_ln("kubernetes", provider.sandbox_for(kube_providers.session("contract")))


def host_secret(tmp_path: Path) -> Path:
    """A file on the host, outside any workspace, that an isolated sandbox cannot see."""
    secret = tmp_path / f"outside-{uuid.uuid4().hex[:6]}" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("top secret\n")
    os.chmod(secret.parent, 0o755)
    return secret
