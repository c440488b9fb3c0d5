"""``pause`` on the agent's side: every process commands started is stopped, one that something
else stopped is left out (so resuming does not continue it), and an agent running as root (not in
a sandbox) refuses. Only this test's own children are ever signalled (the strays' list is
narrowed to them: other processes on this host come and go)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from dispatcher.sandbox.agent import processes
from dispatcher.sandbox.agent.protocol import Pause
from dispatcher.sandbox.agent.workspace import OpError
from tests.polling import until_sync


def _child() -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only waits to be signalled
        threading.Event().wait(30)
        os._exit(0)
    return pid


def _state(pid: int) -> str:
    info = processes._proc_stat(pid)
    assert info is not None
    return info[0]


def _until_state(pid: int, states: str) -> None:
    until_sync(lambda: _state(pid) in states, f"{pid} to reach {states}", interval=0.005)


@pytest.fixture
def children() -> Iterator[tuple[processes._Strays, list[int]]]:
    strays = processes._Strays()  # first: what runs before it is never a stray
    pids = [_child(), _child()]
    everything = strays.list
    strays.list = lambda: [p for p in everything() if p[0] in pids]  # type: ignore[method-assign]
    yield strays, pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_stop_all_stops_every_stray_but_one_already_stopped(
    children: tuple[processes._Strays, list[int]],
) -> None:
    strays, (mine, theirs) = children
    os.kill(theirs, signal.SIGSTOP)  # stopped by something else: not ours to continue
    _until_state(theirs, "Tt")
    stopped: set[tuple[int, int]] = set()
    assert strays.stop_all(time.monotonic() + 10, stopped) == 1
    assert {pid for pid, _ in stopped} == {mine}
    _until_state(mine, "T")
    assert strays.stop_all(time.monotonic() + 10, stopped) == 0  # nothing new: nothing more
    for pid, start in stopped:
        assert processes._signal_process(pid, start, signal.SIGCONT)
    _until_state(mine, "SR")
    assert _state(theirs) in "Tt"


def test_an_agent_running_as_root_stops_nothing() -> None:
    if os.geteuid() != 0:  # pragma: no cover - these tests run as root on the test machines
        pytest.skip("not root")
    commands = processes.Commands.__new__(processes.Commands)
    with pytest.raises(OpError, match="stops no processes"):
        commands.pause(1, Pause(True))
