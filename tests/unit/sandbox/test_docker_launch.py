"""Launching sandboxes against a failing daemon, and the plain ``docker exec`` fallback (fake daemon)."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest
import requests

from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.file_guard import AgentUnavailable
from dispatcher.sandbox.container.image import ImageUnusable
from dispatcher.sandbox.docker.client import DockerUnavailable
from tests.polling import until
from tests.unit.sandbox.docker_rig import Rig, run
from tests.unit.sandbox.fake_containers import HANG, IGNORE_TERM
from tests.unit.sandbox.fake_docker import api_error


async def test_a_failed_launch_is_retried_once(rig: Rig) -> None:
    rig.fake.fail_next("create_container", api_error(500, "devmapper: thin pool full"))
    sandbox = rig.sandbox()
    ran = await run(sandbox, "echo hi")
    assert ran.result.exit_code == 0 and rig.fake.calls.count("create_container") == 2


async def test_transient_daemon_errors_are_retried_by_the_client(rig: Rig) -> None:
    rig.fake.fail_next(
        "create_container", api_error(503, "busy"), requests.exceptions.ConnectionError("reset")
    )
    rig.fake.fail_next("start", api_error(502, "bad gateway"))
    ran = await run(rig.sandbox(), "echo hi")
    assert ran.result.exit_code == 0
    assert rig.fake.calls.count("create_container") == 3 and rig.fake.calls.count("start") == 2


async def test_a_launch_failing_twice_reports_the_daemons_reason_and_leaves_no_container(rig: Rig) -> None:
    rig.fake.fail_next(
        "start", api_error(500, "OCI runtime create failed"), api_error(500, "OCI runtime again")
    )
    sandbox = rig.sandbox()
    with pytest.raises(SandboxError, match="start container: OCI runtime again"):
        await run(sandbox, "echo hi")
    assert rig.fake.calls.count("create_container") == 2
    assert rig.fake.containers_by_id == {}  # both created containers were removed
    assert (await run(sandbox, "echo later")).result.exit_code == 0  # the session is not stuck


async def test_an_unreachable_daemon_is_named(rig: Rig) -> None:
    down = [requests.exceptions.ConnectionError("connection refused")] * 6
    rig.fake.fail_next("create_container", *down)
    with pytest.raises(DockerUnavailable, match="docker daemon unreachable"):
        await run(rig.sandbox(), "echo hi")


async def test_a_container_that_vanished_before_its_exec_is_a_clear_error(rig: Rig) -> None:
    rig.fake.fail_next(
        "exec_create", api_error(404, "No such container"), api_error(404, "No such container")
    )
    with pytest.raises(SandboxError, match="create exec: No such container"):
        await run(rig.sandbox(), "echo hi")
    assert rig.fake.containers_by_id == {}


async def test_an_image_without_python_is_refused_without_a_retry(rig: Rig) -> None:
    rig.fake.agent_runs = False
    with pytest.raises(ImageUnusable, match="exec_fallback: true"):
        await run(rig.sandbox(), "echo hi")
    assert rig.fake.calls.count("create_container") == 1 and rig.fake.containers_by_id == {}


async def test_the_exec_fallback_runs_commands_through_docker_exec(rig: Rig) -> None:
    rig.fake.agent_runs = False
    sandbox = rig.sandbox(exec_fallback=True)
    ran = await run(sandbox, "echo hi")
    assert ran.result.exit_code == 0 and ran.stdout == b"ran: echo hi\n"
    with pytest.raises(AgentUnavailable, match="cannot run the agent"):
        await sandbox.read("notes.txt")


async def test_the_exec_fallback_kills_a_command_that_ignores_sigterm(rig: Rig) -> None:
    rig.fake.agent_runs = False
    sandbox = rig.sandbox(exec_fallback=True)
    ran = await run(sandbox, IGNORE_TERM, timeout=0.1, grace=0.1)
    assert ran.result.timed_out and ran.result.killed and ran.result.signal == 9
    assert sandbox.container_id is not None and ran.notices == []


async def test_the_exec_fallback_removes_the_container_of_an_unkillable_command(rig: Rig) -> None:
    rig.fake.agent_runs = False
    sandbox = rig.sandbox(exec_fallback=True)
    ran = await run(sandbox, HANG, timeout=0.1, grace=0.1)
    assert ran.result.timed_out and ran.result.killed and ran.result.exit_code is None
    assert any("command outlived SIGKILL (timeout)" in n for n in ran.notices)
    assert sandbox.container_id is None and rig.fake.containers_alive == []
    assert (await run(sandbox, "echo again")).result.exit_code == 0


async def test_an_agent_gone_before_its_first_ping_leaves_no_unretrieved_error(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The failed ping's error is seen by its caller, not logged later by the garbage collector
    (from whatever thread runs then) as "Future exception was never retrieved"."""
    caplog.set_level(logging.CRITICAL)  # captured log records would keep the error alive
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reported.append(context))
    rig.fake.agent_runs = False
    sandbox = rig.sandbox(exec_fallback=True)
    assert (await run(sandbox, "echo hi")).result.exit_code == 0
    await sandbox.close()
    gc.collect()
    assert [str(c.get("message")) + repr(c.get("exception")) for c in reported] == []


async def test_start_up_names_a_missing_daemon_and_a_missing_image(rig: Rig) -> None:
    provider = rig.provider()
    rig.fake.fail_next("ping", requests.exceptions.ConnectionError("no such file: /var/run/docker.sock"))
    with pytest.raises(SandboxError, match="no Docker daemon answers"):
        await provider.check_ready()
    rig.fake.images.clear()
    with pytest.raises(SandboxError, match=r"is missing \(run `make images`\)"):
        await provider.check_ready()


async def test_start_on_create_launches_in_the_background_and_the_first_call_finds_it(rig: Rig) -> None:
    provider = rig.provider(start_on_create=True)
    session = rig.session()
    provider.session_created(session)
    await until(lambda: len(rig.fake.containers_alive) == 1, "the container started at creation")
    ran = await run(provider.sandbox_for(session), "echo hi")
    assert ran.stdout == b"ran: echo hi\n" and not ran.notices
    assert rig.fake.calls.count("create_container") == 1  # the call launched nothing
    closed_at_once = rig.session("gone")
    provider.session_created(closed_at_once)
    starting = _starts()
    assert len(starting) == 1
    await provider.close_session(closed_at_once.session_id)  # before its container was up
    await asyncio.gather(*starting)  # the start has given up
    assert len(rig.fake.containers_alive) == 1  # nothing started for a closed session stays


async def test_without_start_on_create_a_new_session_starts_nothing(rig: Rig) -> None:
    provider = rig.provider(start_on_create=False)
    provider.session_created(rig.session())
    assert _starts() == []  # nothing was even scheduled to start
    assert rig.fake.calls.count("create_container") == 0


def _starts() -> list[asyncio.Task[object]]:
    """The background starts of sessions' containers (``session_created`` names them)."""
    return [t for t in asyncio.all_tasks() if t.get_name() == "sandbox-start"]


async def test_an_agent_dying_on_its_socket_is_attached_through_the_daemon_this_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    provider = rig.provider()
    rig.fake.connect_exits = [137]  # killed while it started: nothing says the next one will be
    ran = await run(provider.sandbox_for(rig.session()), "echo hi")
    assert ran.result.exit_code == 0
    assert "exit 137); attaching this one through the Docker daemon" in caplog.text
    assert provider.launcher.sockets is not None and provider.launcher.sockets.usable
    connects = [ex for ex in rig.fake.execs.values() if "--connect" in ex.cmd]
    ran = await run(provider.sandbox_for(rig.session("t")), "echo again")
    assert ran.result.exit_code == 0
    later = [ex for ex in rig.fake.execs.values() if "--connect" in ex.cmd]
    assert len(later) == len(connects) + 1 and later[-1].channel is not None  # the socket again


async def test_an_agent_that_cannot_connect_turns_the_socket_off(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    provider = rig.provider()
    rig.fake.connect_exits = [3]
    assert (await run(provider.sandbox_for(rig.session()), "echo hi")).result.exit_code == 0
    assert "agents are attached through the Docker daemon from now on" in caplog.text
    assert provider.launcher.sockets is not None and not provider.launcher.sockets.usable
    before = len(rig.fake.execs)
    assert (await run(provider.sandbox_for(rig.session("t")), "echo again")).result.exit_code == 0
    assert not any("--connect" in ex.cmd for ex in list(rig.fake.execs.values())[before:])
