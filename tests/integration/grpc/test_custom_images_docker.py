"""Custom sandbox images: broken ones fail ``dispatcher serve`` at start, the README's worked one works.

Every image here is built offline (``docker build --network=none``) from the images ``make images``
made, tagged uniquely, and removed afterwards, like every container the servers started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import uuid
import zipapp
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
import yaml

from dispatcher.client import DispatcherClient
from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION
from dispatcher.sandbox.container.config import SandboxConfig
from dispatcher.sandbox.container.image import AgentVersionMismatch, ImageUnusable
from tests.integration.conftest import BUSYBOX_IMAGE, INSTANCE_PREFIX, ProviderFactory
from tests.server.helpers import text_of
from tests.server.serve_process import READY

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[3]
AGENT = REPO / "dispatcher/sandbox/agent"
MINIMAL = "dispatcher-sandbox:minimal"
SERVE_TIMEOUT = 120
_DRAINS: list[threading.Thread] = []


@pytest.fixture(scope="module")
def build(docker_client: docker.DockerClient) -> Iterator[BuildImage]:
    builder = BuildImage(docker_client)
    yield builder
    builder.cleanup()


class BuildImage:
    """Builds throwaway images with ``docker build --network=none`` and removes them at the end."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.tags: list[str] = []

    def __call__(self, context: Path, dockerfile: str) -> str:
        (context / "Dockerfile").write_text(dockerfile)
        tag = f"dispatcher-test-image:{uuid.uuid4().hex[:12]}"
        run = subprocess.run(
            ["docker", "build", "--network=none", "-q", "-t", tag, str(context)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        self.tags.append(tag)
        return tag

    def cleanup(self) -> None:
        for tag in self.tags:
            with contextlib.suppress(docker.errors.APIError):
                self.client.images.remove(tag, force=True)


def _serve(tmp: Path, image: str) -> subprocess.Popen[str]:
    home = tmp / "home"
    config = tmp / "serve.yaml"
    instance = f"{INSTANCE_PREFIX}-serve-{uuid.uuid4().hex[:6]}"
    config.write_text(
        yaml.safe_dump(
            {
                "sandbox": {
                    "backend": "docker",
                    "image": image,
                    "instance": instance,
                    "workspace_quota": None,
                },
                "tool_confirmation": {"default": {"EXECUTE": "auto", "WRITE": "auto"}},
            }
        )
    )
    env = {**os.environ, "DISPATCHER_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("DISPATCHER_TOKEN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "serve", "--config", str(config), "--listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )


def _serve_fails(tmp: Path, image: str) -> str:
    proc = _serve(tmp, image)
    try:
        _, err = proc.communicate(timeout=SERVE_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    return err


def _context(tmp: Path, name: str) -> Path:
    context = tmp / name
    context.mkdir()
    return context


def test_an_image_without_the_agent_fails_serve_at_start(tmp_path: Path, build: BuildImage) -> None:
    image = build(
        _context(tmp_path, "ctx"),
        f"FROM {MINIMAL}\nUSER root\nRUN rm /opt/dispatcher/agent.pyz\nUSER 1000:1000\n",
    )
    err = _serve_fails(tmp_path, image)
    assert "has no agent at /opt/dispatcher/agent.pyz" in err
    assert "COPY --from=dispatcher-sandbox:latest /opt/dispatcher/agent.pyz" in err and "make images" in err
    # An image of the one-file agent days: what it has and how to run it anyway are named.
    assert "/opt/dispatcher/agent.py " in err and "sandbox.agent_path" in err


def test_an_image_without_python_fails_serve_at_start(
    tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    try:
        docker_client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{BUSYBOX_IMAGE} not built (sandbox_images/build.sh busybox)")
    err = _serve_fails(tmp_path, BUSYBOX_IMAGE)
    assert "has no 'python3' the sandbox user can run" in err
    assert "python3 >= 3.9" in err and "make images" in err


def test_an_image_whose_user_is_root_fails_serve_at_start(tmp_path: Path, build: BuildImage) -> None:
    image = build(_context(tmp_path, "ctx"), f"FROM {MINIMAL}\nUSER root\n")
    err = _serve_fails(tmp_path, image)
    assert "its USER is root" in err and "USER 1000:1000" in err


def _old_agent_image(tmp: Path, build: BuildImage) -> str:
    context = _context(tmp, "ctx-old")
    package = tmp / "old-agent"
    package.mkdir()
    for module in AGENT.glob("*.py"):
        shutil.copy(module, package / module.name)
    source = (AGENT / "protocol.py").read_text()
    old = source.replace(
        f"PROTOCOL_VERSION = {PROTOCOL_VERSION}\n", f"PROTOCOL_VERSION = {PROTOCOL_VERSION - 1}\n"
    )
    assert old != source
    (package / "protocol.py").write_text(old)
    zipapp.create_archive(package, context / "agent.pyz")  # as sandbox_images/build.sh packs it
    return build(
        context,
        f"FROM {MINIMAL}\nUSER root\nCOPY agent.pyz /opt/dispatcher/agent.pyz\n"
        "RUN chmod 0444 /opt/dispatcher/agent.pyz\nUSER 1000:1000\n",
    )


def test_an_agent_of_another_protocol_version_fails_serve_at_start(tmp_path: Path, build: BuildImage) -> None:
    err = _serve_fails(tmp_path, _old_agent_image(tmp_path, build))
    assert f"its agent speaks protocol version {PROTOCOL_VERSION - 1}" in err
    assert f"this server speaks version {PROTOCOL_VERSION}" in err


async def test_the_agent_version_is_compared_on_connect(
    tmp_path: Path, build: BuildImage, make_provider: ProviderFactory
) -> None:
    provider = make_provider(SandboxConfig(image=_old_agent_image(tmp_path, build)))
    sandbox = provider.sandbox_for(make_provider.session("old-agent"))
    with pytest.raises(AgentVersionMismatch) as info:
        await sandbox.exists("x")
    message = str(info.value)
    assert f"protocol version {PROTOCOL_VERSION - 1}" in message
    assert f"this server speaks version {PROTOCOL_VERSION}" in message and "make images" in message


def test_the_readme_worked_custom_image_builds_and_serves(tmp_path: Path, build: BuildImage) -> None:
    # The README's recipe, with a wheel built here from a tiny local package instead of `pip download`
    # (no network): the same Dockerfile installs whatever wheels/ holds.
    package = tmp_path / "pkg"
    (package / "hello_dispatcher").mkdir(parents=True)
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "hello-dispatcher"\nversion = "1.0"\n'
    )
    (package / "hello_dispatcher" / "__init__.py").write_text(
        "def greet():\n    return 'hello from a wheel'\n"
    )
    context = _context(tmp_path, "ctx")
    wheel = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-w",
            str(context / "wheels"),
            str(package),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wheel.returncode == 0, wheel.stderr
    image = build(context, _readme_dockerfile())
    proc = _serve(tmp_path, image)
    try:
        target = _wait_serving(proc)
        with DispatcherClient(target, home=str(tmp_path / "home")) as client:
            session = client.create_session(workspace="w")
            try:
                result = client.call(
                    session.session_id,
                    "shell",
                    {"command": "python3 -c 'import hello_dispatcher; print(hello_dispatcher.greet())'"},
                )
                assert not result.is_error, result
                assert "hello from a wheel" in text_of(result)
            finally:
                client.close_session(session.session_id)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for thread in _DRAINS:
            thread.join(timeout=10)  # the pipe is at EOF once the server exited
        _DRAINS.clear()
        if proc.stderr is not None:
            proc.stderr.close()


def _readme_dockerfile() -> str:
    """The worked example's Dockerfile, taken from sandbox_images/README.md as written there."""
    readme = (REPO / "sandbox_images/README.md").read_text()
    start = readme.index("```dockerfile\n") + len("```dockerfile\n")
    return readme[start : readme.index("```", start)]


def _wait_serving(proc: subprocess.Popen[str]) -> str:
    """The server's address once it says it serves; its stderr is drained from then on."""
    assert proc.stderr is not None
    stream = proc.stderr
    lines: list[str] = []
    for line in stream:  # ends when the server exits: no sleep, no hang past its own exit
        lines.append(line)
        match = READY.search(line)
        if match:
            drain = threading.Thread(target=shutil.copyfileobj, args=(stream, _Sink()), daemon=True)
            drain.start()
            _DRAINS.append(drain)
            return match.group(1)
    pytest.fail("dispatcher serve did not start:\n" + "".join(lines))


class _Sink:
    def write(self, text: str) -> int:
        return len(text)


async def test_without_exec_fallback_an_image_without_python_fails_at_first_use(
    make_provider: ProviderFactory, docker_client: docker.DockerClient
) -> None:
    try:
        docker_client.images.get(BUSYBOX_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{BUSYBOX_IMAGE} not built (sandbox_images/build.sh busybox)")
    provider = make_provider(SandboxConfig(image=BUSYBOX_IMAGE))
    with pytest.raises(ImageUnusable) as info:
        await provider.sandbox_for(make_provider.session("nopy")).exists("x")
    assert "cannot run 'python3'" in str(info.value) and "sandbox.exec_fallback: true" in str(info.value)
