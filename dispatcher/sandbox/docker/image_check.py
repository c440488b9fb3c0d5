"""The start-up check of the sandbox image: python, the agent, its protocol version, a non-root USER.

A custom image that lacks one of them would otherwise fail on the first tool call of the first
session, with an error far from its cause. ``check_image`` runs one short container of the image
(no network, no capabilities, read-only, as the sandbox user) that prints the agent's protocol
version, and turns every way that can go wrong into a message saying what is missing and how to
build it.
"""

from __future__ import annotations

import contextlib
import re
import secrets
from typing import Any

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.agent.protocol import PROTOCOL_VERSION
from dispatcher.sandbox.container.config import AGENT_PATH, SandboxConfig
from dispatcher.sandbox.container.image import (
    HOW_TO_BUILD,
    HOW_TO_GET_AGENT,
    ImageUnusable,
)
from dispatcher.sandbox.container.labels import LABEL_INSTANCE
from dispatcher.sandbox.docker.client import DockerAPI

PROBE_TIMEOUT_SECONDS = 60
_OLD_LAYOUT = (
    "; an image built for an older server has the agent as one file, /opt/dispatcher/agent.py "
    "(setting sandbox.agent_path to it runs that one, if its protocol version still fits)"
)
_VERSION_RE = re.compile(r"dispatcher-agent protocol (\d+)")
_ROOT_USERS = {"", "0", "root"}
_NOT_FOUND_RE = re.compile(r"executable file not found|no such file or directory|permission denied", re.I)


async def check_image(api: DockerAPI, config: SandboxConfig, *, instance: str) -> list[str]:
    """Refuse an image sessions cannot use; returns warnings (the docker-exec fallback in use).

    Raises:
        ImageUnusable: python or the agent is missing or unreadable, the agent speaks another
            protocol version, or the image's USER is root.
    """
    image = config.image
    problems: list[str] = []
    inspected: dict[str, Any] = await api.run("inspect image", lambda: api.client.inspect_image(image))
    user = str((inspected.get("Config") or {}).get("User") or "")
    if user.split(":")[0] in _ROOT_USERS:
        problems.append(
            f"its USER is {user or 'unset'} (root): sandboxes never run as root, they run as "
            f"{config.user} (sandbox.user) or the tenant's uid, so an image must be made for an "
            f"unprivileged user: end its Dockerfile with `USER {config.user}`"
        )
    code, output, start_error = await _probe(api, config, instance)
    shown = f"`{config.agent_python} {config.agent_path} --version` as {config.user}"
    fallback = False
    if start_error is not None and not _NOT_FOUND_RE.search(start_error):
        raise ImageUnusable(
            f"sandbox image {image!r}: the start-up check could not run {shown}: {start_error}"
        )
    if start_error is not None:
        fallback = True
        problems.append(
            f"it has no {config.agent_python!r} the sandbox user can run ({shown}: {start_error}); the "
            "agent needs python3 >= 3.9 with its standard library (or set sandbox.agent_python)"
        )
    else:
        match = _VERSION_RE.search(output)
        if code == 0 and match and int(match.group(1)) == PROTOCOL_VERSION:
            pass
        elif match:
            problems.append(
                f"its agent speaks protocol version {match.group(1)}, this server speaks "
                f"version {PROTOCOL_VERSION}: put this server's agent at {config.agent_path} "
                f"({HOW_TO_GET_AGENT})"
            )
        elif "No such file" in output or "can't open file" in output:
            fallback = True
            old = _OLD_LAYOUT if config.agent_path == AGENT_PATH else ""
            problems.append(
                f"it has no agent at {config.agent_path} (sandbox.agent_path){old}: put this "
                f"server's agent there ({HOW_TO_GET_AGENT})"
            )
        elif "Permission denied" in output:
            problems.append(
                f"the sandbox user {config.user} cannot read the agent at {config.agent_path}: "
                "make it mode 0444 (and its directory 0555)"
            )
        elif code in (126, 127):
            fallback = True
            problems.append(f"{shown} cannot run (exit {code}): {_tail(output)}")
        else:
            problems.append(
                f"its agent at {config.agent_path} predates protocol versions or is not the "
                f"dispatcher agent ({shown} exited {code}: {_tail(output)}); this server speaks "
                f"version {PROTOCOL_VERSION}: put this server's agent there ({HOW_TO_GET_AGENT})"
            )
    if fallback and config.exec_fallback and len(problems) == 1:
        return [
            f"sandbox image {image!r}: {problems[0]}; sandbox.exec_fallback is on, so shell runs "
            "through docker exec and the file tools fail"
        ]
    if problems:
        raise ImageUnusable(
            f"sandbox image {image!r} cannot be used: {'; '.join(problems)}. To fix: {HOW_TO_BUILD}."
        )
    return []


async def _probe(api: DockerAPI, config: SandboxConfig, instance: str) -> tuple[int, str, str | None]:
    """Run the agent's ``--version`` in a throwaway container: (exit code, output, start error)."""
    client = api.client
    name = f"dispatcher-probe-{instance[:12]}-{secrets.token_hex(3)}"

    def create() -> str:
        host_config = client.create_host_config(
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            read_only=True,
            mem_limit=config.mem_limit,
            pids_limit=config.pids_limit,
            runtime=config.runtime,
        )
        created = client.create_container(
            image=config.image,
            name=name,
            entrypoint=[config.agent_python],
            command=["-I", config.agent_path, "--version"],
            user=config.user,
            network_disabled=True,
            labels={LABEL_INSTANCE: instance, "dispatcher.probe": "1"},
            host_config=host_config,
        )
        return str(created["Id"])

    container_id = await api.run("create probe container", create)
    try:
        try:
            await api.start(container_id)
        except SandboxError as exc:
            return -1, "", str(exc)
        status = await api.run(
            "wait for probe container", lambda: client.wait(container_id, timeout=PROBE_TIMEOUT_SECONDS)
        )
        logs = await api.run(
            "probe container logs", lambda: client.logs(container_id, stdout=True, stderr=True)
        )
        return int(status.get("StatusCode", -1)), bytes(logs).decode(errors="replace"), None
    finally:
        with contextlib.suppress(SandboxError):
            await api.remove(container_id)


def _tail(output: str) -> str:
    return " ".join(output.split())[-300:] or "no output"
