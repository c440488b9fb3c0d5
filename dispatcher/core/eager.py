"""Start a coroutine as a task now, so that one finishing without a wait is done at once.

A NONE tool, and every call refused before it runs, finish without ever waiting; awaiting such a
call through a task costs more than its work: a loop turn for the task's first step, then the
waiter's wake-up chain. ``start`` makes the task and runs its first step at once, as that task
(``asyncio.current_task()`` is it, timeouts and cancels bind to it, the step runs in the task's
context); ``Started.done_now`` then says whether the coroutine finished in it, and ``outcome()``
gives its answer without waiting for the loop. The task itself completes on its next step, as a
task always does, so a done-callback or an ``await`` of it behaves as before.

Python 3.12's ``asyncio.eager_task_factory`` does this for every task of a loop; this is the same,
on 3.11, for the places on the dispatch path that need it. It uses asyncio's ``_enter_task`` and
``_leave_task`` (how a task marks itself current; both exist from 3.7 to 3.13):
``tests/unit/core/test_eager.py`` fails if they change.
"""

from __future__ import annotations

import asyncio
import contextvars
from asyncio import tasks as _tasks
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

__all__ = ["Started", "start"]

T = TypeVar("T")

_WAITING, _RETURNED, _RAISED = 0, 1, 2


class Started(Generic[T]):
    """A coroutine started by ``start``: its task, and what its first step came to."""

    __slots__ = ("_state", "_value", "task")

    def __init__(self, task: asyncio.Task[T], state: int, value: Any) -> None:
        self.task = task
        self._state = state
        self._value = value

    @property
    def done_now(self) -> bool:
        """The coroutine finished (returned or raised) in its first step."""
        return self._state != _WAITING

    def outcome(self) -> T:
        """What the coroutine returned, or raises what it raised (only when ``done_now``)."""
        if self._state == _RETURNED:
            value: T = self._value
            return value
        if self._state == _RAISED:
            # The task raises it too on its next step; nobody awaits the task for it.
            self.task.add_done_callback(_retrieved)
            raise self._value
        raise asyncio.InvalidStateError("the coroutine is still running")


def start(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> Started[T]:
    """``coro`` as a task whose first step has already run."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    driver = _Driver(coro)
    task: asyncio.Task[T] = loop.create_task(driver, name=name, context=context)
    caller = _tasks.current_task(loop)
    if caller is not None:
        _tasks._leave_task(loop, caller)
    _tasks._enter_task(loop, task)
    try:
        context.run(driver.first_step)
    finally:
        _tasks._leave_task(loop, task)
        if caller is not None:
            _tasks._enter_task(loop, caller)
    return Started(task, driver.state, driver.value)


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # its exception was raised by ``outcome``: not "never retrieved"


class _Driver(Coroutine[Any, Any, Any]):
    """What the task runs: ``coro`` after its first step (taken by ``start``) and what it yielded.

    The task's own first step then only finishes (``coro`` already did) or re-yields the future
    ``coro`` waits on; from there every send and throw goes straight on to ``coro``. A throw that
    arrives before the task's first step (a cancel at once) reaches ``coro`` where it waits, as it
    would in a task that had started it.
    """

    __slots__ = ("_coro", "_first", "state", "value")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._first = True  # the task has not stepped yet: re-yield what the first step yielded
        self.state = _WAITING
        self.value: Any = None

    def first_step(self) -> None:
        try:
            self.value = self._coro.send(None)
        except StopIteration as stop:
            self.state, self.value = _RETURNED, stop.value
        except BaseException as exc:  # kept for the task to raise, as it would
            self.state, self.value = _RAISED, exc

    def send(self, value: Any) -> Any:
        if self._first:
            self._first = False
            if self.state == _RETURNED:
                raise StopIteration(self.value)
            if self.state == _RAISED:
                raise self.value
            return self.value  # the future the coroutine waits on, its blocking flag still set
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._first and self.state != _WAITING:
            self._first = False
            return self.send(None)  # finished already: a late cancel changes nothing
        self._first = False
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - asyncio throws instances

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, Any]:  # pragma: no cover - only a task drives it
        raise TypeError("an eager start is driven by its task, not awaited")
