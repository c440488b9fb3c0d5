"""``core/eager.py``: a coroutine started now behaves as the task it is, whether it waits or not."""

from __future__ import annotations

import asyncio
import contextvars
import gc
from typing import Any

import pytest

from dispatcher.core import eager

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="caller")


async def test_a_coroutine_that_does_not_wait_is_done_at_once_as_its_own_task() -> None:
    seen: list[Any] = []

    async def quick() -> int:
        seen.append(asyncio.current_task())
        VAR.set("inside")
        return 7

    caller = asyncio.current_task()
    started = eager.start(quick())
    assert started.done_now and started.outcome() == 7
    assert seen == [started.task] and started.task is not caller
    assert asyncio.current_task() is caller  # given back
    assert VAR.get() == "caller"  # the step ran in the task's own context
    assert await started.task == 7


async def test_an_error_raised_at_once_is_raised_by_outcome_and_never_reported_unretrieved() -> None:
    unretrieved: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unretrieved.append(ctx))

    async def broken() -> None:
        raise ValueError("no")

    started = eager.start(broken())
    assert started.done_now
    with pytest.raises(ValueError, match="no"):
        started.outcome()
    await asyncio.wait({started.task})
    del started  # the task with it: a task never retrieved from reports when it is collected
    gc.collect()
    await asyncio.sleep(0)
    assert unretrieved == []


async def test_a_coroutine_that_waits_goes_on_in_its_task() -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    tasks: list[Any] = []

    async def slow() -> str:
        tasks.append(asyncio.current_task())
        VAR.set("inside")
        value = await gate
        tasks.append(asyncio.current_task())
        return value + VAR.get()

    started = eager.start(slow())
    assert not started.done_now
    with pytest.raises(asyncio.InvalidStateError):
        started.outcome()
    gate.set_result("got-")
    assert await started.task == "got-inside"
    assert tasks == [started.task, started.task]


async def test_a_cancel_before_the_task_steps_reaches_the_coroutine_where_it_waits() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    cleaned: list[str] = []

    async def waits() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            cleaned.append("cancelled at its await")
            raise

    started = eager.start(waits())
    started.task.cancel()  # before the loop ever ran the task
    with pytest.raises(asyncio.CancelledError):
        await started.task
    assert cleaned == ["cancelled at its await"]


async def test_a_timeout_entered_in_the_first_step_cancels_the_started_task_not_the_caller() -> None:
    async def overruns() -> str:
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            return "timed out"
        return "never"

    started = eager.start(overruns())
    assert not started.done_now
    assert await started.task == "timed out"
    await asyncio.sleep(0.02)  # the caller is still running: this line is reached


async def test_started_from_a_plain_callback_with_no_task_running() -> None:
    loop = asyncio.get_running_loop()
    result: asyncio.Future[eager.Started[str]] = loop.create_future()

    async def who() -> str:
        return "task" if asyncio.current_task() is not None else "none"

    loop.call_soon(lambda: result.set_result(eager.start(who())))
    started = await result
    assert started.done_now and started.outcome() == "task"
    assert await started.task == "task"
