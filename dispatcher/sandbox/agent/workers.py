"""Worker threads started ahead of need, so that serving a request never depends on making one."""

from __future__ import annotations

import queue
import sys
import threading
from collections import deque
from typing import Any

FILE_WORKERS, FILE_WORKERS_MAX = 4, 8  # threads for file ops: started at once, at most
EXEC_WORKERS, EXEC_WORKERS_MAX = 4, 32  # threads for commands (the host runs 4 at once per session)

_Job = tuple[Any, tuple[Any, ...]]


class Workers:
    """Threads started ahead of need, so that serving a request never depends on making one.

    A thread takes a pid like a process does: once a command's leftovers have filled the pids
    limit, ``threading.Thread.start`` fails, but these threads are already running. More are
    started on demand up to ``limit`` while pids allow.
    """

    def __init__(self, name: str, started: int, limit: int) -> None:
        self._name = name
        self._limit = limit
        self._lock = threading.Lock()
        self._idle: list[queue.SimpleQueue[_Job | None]] = []
        self._backlog: deque[_Job] = deque()
        self._count = 0
        for _ in range(started):
            self._start(None)

    def _start(self, job: _Job | None) -> bool:
        """A new worker, given ``job`` or made idle; False when the limit or the pids forbid."""
        inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        if job is not None:
            inbox.put(job)
        with self._lock:
            if self._count >= self._limit:
                return False
            self._count += 1
        thread = threading.Thread(
            target=self._work, args=(inbox,), name=f"{self._name}-{self._count}", daemon=True
        )
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": no pid left
            with self._lock:
                self._count -= 1
            return False
        if job is None:
            with self._lock:
                self._idle.append(inbox)
        return True

    def _work(self, inbox: queue.SimpleQueue[_Job | None]) -> None:
        job = inbox.get()
        while job is not None:
            fn, args = job
            try:
                fn(*args)
            except BaseException as exc:  # handlers answer their own errors; never lose the worker
                print(f"agent: {self._name} worker: {exc!r}", file=sys.stderr)
            with self._lock:
                if self._backlog:
                    job = self._backlog.popleft()
                    continue
                self._idle.append(inbox)
            job = inbox.get()

    def try_submit(self, fn: Any, *args: Any) -> bool:
        """Run ``fn(*args)`` on an idle worker or a new one; False when there is neither."""
        with self._lock:
            if self._idle:
                self._idle.pop().put((fn, args))
                return True
        return self._start((fn, args))

    def submit(self, fn: Any, *args: Any) -> None:
        """Run ``fn(*args)`` on a worker, queued until one is free when none can be started."""
        if self.try_submit(fn, *args):
            return
        with self._lock:
            if self._idle:
                self._idle.pop().put((fn, args))
            else:
                self._backlog.append((fn, args))

    def shutdown(self) -> None:
        """Drop queued jobs and let idle workers end (busy ones end with their job)."""
        with self._lock:
            self._backlog.clear()
            idle, self._idle = self._idle, []
        for inbox in idle:
            inbox.put(None)
