"""Launch slots: a call that needs a container goes before background launches and re-adoptions,
and a waiter that is cancelled never loses (or keeps) a slot."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.sandbox.launch_slots import LaunchSlots, in_background
from tests.polling import until
from tests.unit.sandbox.docker_rig import Rig, run


async def _holder(
    slots: LaunchSlots, name: str, order: list[str], background: bool, gate: asyncio.Event
) -> None:
    async def take() -> None:
        async with slots.take():
            order.append(name)
            await gate.wait()

    if background:
        with in_background():
            await take()
    else:
        await take()


async def test_calls_go_first_and_each_kind_keeps_its_order() -> None:
    slots, gate = LaunchSlots(1), asyncio.Event()
    order: list[str] = []
    first = asyncio.create_task(_holder(slots, "bg0", order, True, gate))
    await until(lambda: order == ["bg0"])
    tasks = [
        asyncio.create_task(_holder(slots, name, order, background, gate))
        for name, background in (("bg1", True), ("call1", False), ("bg2", True), ("call2", False))
    ]
    await until(lambda: slots.waiting == 4)
    gate.set()
    await asyncio.gather(first, *tasks)
    assert order == ["bg0", "call1", "call2", "bg1", "bg2"]


async def test_a_free_slot_is_taken_at_once_and_cancelled_waiters_lose_nothing() -> None:
    slots, gate = LaunchSlots(2), asyncio.Event()
    order: list[str] = []
    holders = [asyncio.create_task(_holder(slots, f"h{i}", order, False, gate)) for i in range(2)]
    await until(lambda: len(order) == 2)
    waiter = asyncio.create_task(_holder(slots, "cancelled", order, False, asyncio.Event()))
    await until(lambda: slots.waiting == 1)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert slots.waiting == 0
    # Handed a slot in the same turn as it is cancelled: the slot goes on to the next one.
    late = asyncio.create_task(_holder(slots, "late", order, False, asyncio.Event()))
    after = asyncio.create_task(_holder(slots, "after", order, False, gate))
    await until(lambda: slots.waiting == 2)
    gate.set()
    await asyncio.sleep(0)  # the holders release: "late" is handed a slot...
    late.cancel()  # ... and cancelled before it runs
    await asyncio.gather(*holders, late, after, return_exceptions=True)
    assert "cancelled" not in order and "after" in order
    # Every slot came back: two can be held at once again, without waiting.
    held: list[Any] = []
    for _ in range(2):
        cm = slots.take()
        await asyncio.wait_for(cm.__aenter__(), 1)
        held.append(cm)
    for cm in held:
        await cm.__aexit__(None, None, None)


async def test_a_calls_launch_goes_before_the_re_adoptions_queued_ahead_of_it(rig: Rig) -> None:
    provider = rig.provider(max_concurrent_launches=1, start_on_create=False)
    order: list[str] = []
    gate = asyncio.Event()
    launch_once = provider.launcher.launch_once

    async def recorded(session: Any) -> Any:
        order.append("call")
        return await launch_once(session)

    provider.launcher.launch_once = recorded  # type: ignore[method-assign]
    slots = provider._launch_slots
    background = [asyncio.create_task(_holder(slots, f"bg{i}", order, True, gate)) for i in range(3)]
    await until(lambda: order == ["bg0"] and slots.waiting == 2)
    call = asyncio.create_task(run(provider.sandbox_for(rig.session()), "echo hi"))
    await until(lambda: slots.waiting == 3)
    gate.set()
    ran = await call
    await asyncio.gather(*background)
    assert ran.result.exit_code == 0
    assert order == ["bg0", "call", "bg1", "bg2"]
