"""A clock that moves only when the test says so: for code that measures durations or ages, in
place of sleeping until wall time has passed (``DispatcherConfig.clock``, the Docker provider's);
and a jump of the event loop's own clock, for timeouts the code under test takes from the loop."""

from __future__ import annotations

import asyncio


class ManualClock:
    """Monotonic seconds; ``advance`` moves them."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def jump_loop_clock(seconds: float) -> None:
    """Move the running event loop's clock ``seconds`` forward, so its timers due by then fire at
    once: a timeout under test elapses when the test says (once the command printed that it is
    ready), not whenever a busy machine gets there, possibly before the command even ran."""
    loop = asyncio.get_running_loop()
    before = loop.time
    loop.time = lambda: before() + seconds  # type: ignore[method-assign]
