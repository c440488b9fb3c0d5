"""The agent's pre-started workers and its view of leftover processes (issue 12)."""

from __future__ import annotations

import os
import threading

from dispatcher.sandbox.agent import processes
from dispatcher.sandbox.agent.workers import Workers


def test_workers_are_started_ahead_and_never_exceed_their_limit() -> None:
    workers = Workers("t-workers", 2, 3)
    # Counted by name: other tests' threads may come and go meanwhile.
    ours = [t for t in threading.enumerate() if t.name.startswith("t-workers-")]
    assert len(ours) == 2  # running before any request
    release = threading.Event()
    started = threading.Semaphore(0)

    def job() -> None:
        started.release()
        release.wait(10)

    assert all(workers.try_submit(job) for _ in range(3))  # two idle, one new
    for _ in range(3):
        assert started.acquire(timeout=10)
    assert not workers.try_submit(job)  # busy and at the limit: the caller answers proc_limit
    done = threading.Event()
    workers.submit(done.set)  # file ops wait for a worker instead
    assert not done.is_set()
    release.set()
    assert done.wait(10)
    workers.shutdown()


def test_strays_are_what_started_after_the_agent() -> None:
    strays = processes._Strays()
    # On this host other processes come and go; what ran before the agent is never a stray.
    spared = {1, os.getpid(), os.getppid()}
    assert not spared & {p for p, _, _ in strays.list()}
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only waits to be counted
        threading.Event().wait(30)
        os._exit(0)
    try:
        found = {p for p, _, _ in strays.list()}
        assert pid in found and not spared & found
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert pid not in {p for p, _, _ in strays.list()}
