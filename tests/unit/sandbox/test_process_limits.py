"""``sandbox.processes``: the bounds of a session's background processes, validated with errors
naming their key, and given to the agent (``--process-limits``) on every backend only when they
are not the agent's own defaults."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config.load import load_config
from dispatcher.core.errors import ConfigError
from dispatcher.core.sessions.session import Session
from dispatcher.sandbox.agent.agent import parse_limits
from dispatcher.sandbox.agent.table import Limits
from dispatcher.sandbox.container.config import ProcessLimits, SandboxConfig, process_limit_args
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig
from dispatcher.sandbox.docker.agent.attach import _agent_argv
from dispatcher.sandbox.kubernetes.manifests import pod_manifest
from dispatcher.sandbox.local import LocalSandbox


def test_the_keys_and_defaults_are_the_agents() -> None:
    agent = {f.name: f.default for f in dataclasses.fields(Limits)}
    assert ProcessLimits().model_dump() == agent


def test_only_what_differs_from_the_defaults_is_passed_and_the_agent_reads_it() -> None:
    assert process_limit_args(ProcessLimits()) == [] and process_limit_args(None) == []
    assert process_limit_args(ProcessLimits(running=32, ring_bytes=1 << 20)) == []  # said, but the defaults
    args = process_limit_args(ProcessLimits(running=2, ring_bytes="64k", stdin_bytes=4096))  # type: ignore[arg-type]
    assert args[0] == "--process-limits"
    assert json.loads(args[1]) == {"running": 2, "ring_bytes": 65536, "stdin_bytes": 4096}
    assert parse_limits(args[1]) == Limits(running=2, ring_bytes=65536, stdin_bytes=4096)


def _session() -> Session:
    return Session(
        session_id="s1", tenant_id="t", workspace_name="w", workspace_path="/tmp/w", sandbox_uid=1000
    )


def test_every_backend_starts_its_agent_with_them() -> None:
    config = SandboxConfig.from_mapping({"processes": {"running": 3}})
    assert _agent_argv(config, [])[-2:] == ["--process-limits", '{"running":3}']
    assert "--process-limits" not in _agent_argv(SandboxConfig(), [])
    pod = pod_manifest(config, KubernetesConfig(namespace="n"), _session(), instance="i", name="p")
    command = pod["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--process-limits", '{"running":3}']
    local = LocalSandbox("/tmp/w", agent_args=["--grants", "[]"], process_limits=ProcessLimits(finished=5))
    assert local._agent_args == ("--grants", "[]", "--process-limits", '{"finished":5}')


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({"running": 0}, "sandbox.processes.running: must be greater than 0"),
        ({"running": 5000}, "sandbox.processes.running: "),
        ({"running": "many"}, "sandbox.processes.running: "),
        ({"finished": 0}, "sandbox.processes.finished: "),
        ({"ring_bytes": "lots"}, "sandbox.processes.ring_bytes: "),
        ({"ring_bytes": 10}, "sandbox.processes.ring_bytes: must be at least 1k"),
        ({"ring_bytes": "32m"}, "sandbox.processes.ring_bytes: must not be more than max_ring_bytes"),
        (
            {"max_ring_bytes": "128m"},
            "sandbox.processes.max_ring_bytes: must not be more than total_ring_bytes",
        ),
        ({"stdin_bytes": "64m"}, "sandbox.processes.stdin_bytes: must be at most 32m"),
        (
            {"total_ring_bytes": "1g"},
            "sandbox.processes: total_ring_bytes (1 GiB) must be less than mem_limit",
        ),
        ({"nope": 1}, "sandbox.processes.nope: unknown key"),
    ],
)
def test_bad_values_name_their_key(section: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        SandboxConfig.from_mapping({"processes": section})
    assert error in str(caught.value), str(caught.value)


def test_the_local_backend_takes_them_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"sandbox": {"backend": "local", "processes": {"running": 4}}}))
    assert load_config(path, env={}).sandbox.processes.running == 4
    path.write_text(yaml.safe_dump({"sandbox": {"backend": "local", "processes": {}, "image": "x"}}))
    with pytest.raises(
        ConfigError, match=r"sandbox\.image: the local backend takes no options but processes"
    ):
        load_config(path, env={})
