"""A clock that moves only when the test says so: for code that measures durations or ages, in
place of sleeping until wall time has passed (``DispatcherConfig.clock``, the Docker provider's)."""

from __future__ import annotations


class ManualClock:
    """Monotonic seconds; ``advance`` moves them."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
