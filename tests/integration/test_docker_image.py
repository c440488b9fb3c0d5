"""The sandbox images (issue 8 points 3-4): the environment commands see, the default image's tools,
git on a workspace another uid made, and the minimal variant."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from dispatcher.core.sandbox_api import Sandbox
from dispatcher.sandbox.container.config import SandboxConfig
from tests.integration.conftest import ProviderFactory
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

MINIMAL_IMAGE = "dispatcher-sandbox:minimal"
ENV_IMAGE = "dispatcher-test-env:latest"


async def test_commands_see_the_image_environment(sandbox: Sandbox) -> None:
    ran = await run(sandbox, 'echo "unbuffered=$PYTHONUNBUFFERED home=$HOME lang=$LANG"')
    assert ran.result.exit_code == 0, ran.err
    assert ran.out == "unbuffered=1 home=/tmp lang=C.UTF-8\n"


@pytest.fixture(scope="module")
def env_image(docker_client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A custom image adding an ENV on top of the default one (built offline, removed after)."""
    ctx = tmp_path_factory.mktemp("env-image")
    (ctx / "Dockerfile").write_text(
        "FROM dispatcher-sandbox:latest\nENV DISPATCHER_TEST_FROM_IMAGE='set by the image' PATH=/opt/tools:$PATH\n"
    )
    subprocess.run(
        ["docker", "build", "-q", "--network=none", "-t", ENV_IMAGE, str(ctx)],
        check=True,
        capture_output=True,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    yield ENV_IMAGE
    subprocess.run(["docker", "rmi", "-f", ENV_IMAGE], check=False, capture_output=True)


async def test_a_custom_image_env_reaches_commands(make_provider: ProviderFactory, env_image: str) -> None:
    provider = make_provider(SandboxConfig(image=env_image))
    sandbox = provider.sandbox_for(make_provider.session())
    ran = await run(sandbox, 'echo "$DISPATCHER_TEST_FROM_IMAGE"; echo "$PATH"', env={"EXTRA": "x"})
    assert ran.result.exit_code == 0, ran.err
    first, path = ran.out.splitlines()
    assert first == "set by the image" and path.startswith("/opt/tools:")


async def test_default_image_has_the_tools_an_agent_needs(sandbox: Sandbox) -> None:
    script = (
        "set -e; ps -o pid= -p $$ >/dev/null; file -L /bin/sh | grep -q ELF; pip --version; git --version;"
        " for t in find grep sed diff patch less xz zip unzip; do command -v $t >/dev/null; done;"
        " test -s /etc/ssl/certs/ca-certificates.crt;"
        " python3 -m venv /tmp/venv && /tmp/venv/bin/python -m pip --version"
    )
    ran = await run(sandbox, script, timeout=120)
    assert ran.result.exit_code == 0, ran.out + ran.err
    assert "/tmp/venv" in ran.out  # the venv's own pip answered


async def test_git_commit_on_a_workspace_another_uid_made(make_provider: ProviderFactory) -> None:
    session = make_provider.session("git")
    workspace = Path(session.workspace_path)
    # As a host user other than the sandbox's would leave it: git refuses such a repository
    # ("dubious ownership") unless safe.directory allows it.
    os.chown(workspace, 4321, 4321)
    workspace.chmod(0o777)
    (workspace / "README").write_text("hello\n")
    os.chown(workspace / "README", 4321, 4321)
    sandbox = make_provider().sandbox_for(session)
    ran = await run(
        sandbox,
        "set -e; git init -q . && git add README && git commit -qm first && git log --format=%s"
        " && git status --porcelain && stat -c %u /workspace",
    )
    assert ran.result.exit_code == 0, ran.out + ran.err
    lines = ran.out.splitlines()
    assert lines[0] == "first" and lines[-1] == "4321"


async def test_minimal_variant_runs_the_agent(make_provider: ProviderFactory) -> None:
    provider = make_provider(SandboxConfig(image=MINIMAL_IMAGE))
    sandbox = provider.sandbox_for(make_provider.session("min"))
    await sandbox.write("a.txt", "through the agent\n")
    assert await sandbox.read("a.txt") == "through the agent\n"
    ran = await run(sandbox, 'python3 -c "import json; print(json.dumps(1))"; command -v git || echo no-git')
    assert ran.result.exit_code == 0, ran.err
    assert ran.out == "1\nno-git\n"  # file operations above worked: only the agent does those
