"""Rows of the benchmark table, latency statistics, and the markdown printer.

Every measuring module returns ``list[Row]``; ``print_table`` adds each row's speed relative to
the ``docker exec`` baseline measured in the same run, so ratios never mix machines or runs.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

BASELINE = "docker exec true (API)"
"""The row every other row's ratio is computed against."""


@dataclass(frozen=True, slots=True)
class Row:
    """One measured figure: latency percentiles in ms, or a throughput in ``note``."""

    group: str
    name: str
    p50_ms: float | None
    p95_ms: float | None = None
    n: int = 0
    note: str = ""
    compare: bool = True
    """False for figures a ratio to docker exec means nothing for (throughput, totals)."""


def percentile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]


IDLE_GAP_SECONDS = 0.002
"""The pause before each call of the "after idle" rows: an agent's call cadence (the client and the
model between calls), long enough for an idle processor to sleep (see ``time_async``)."""


async def time_async(
    fn: Callable[[], Awaitable[object]], n: int, *, warmup: int = 3, gap: float = 0.0
) -> list[float]:
    """Latencies in ms of ``n`` sequential awaited calls, after ``warmup`` unmeasured ones.

    ``gap``: seconds of sleep before each call, not timed. Back-to-back calls keep every process
    involved running; a server's calls arrive after a pause, when the processes (and, in a virtual
    machine, its processors) have gone idle and must be woken, which a tight loop never measures.
    """
    for _ in range(warmup):
        await fn()
    samples = []
    for _ in range(n):
        if gap:
            await asyncio.sleep(gap)
        started = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def row(group: str, name: str, samples: Sequence[float], note: str = "") -> Row:
    """A row from latency samples in ms."""
    return Row(group, name, percentile(samples, 0.5), percentile(samples, 0.95), len(samples), note)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.0f}"


def render_table(rows: Sequence[Row], baseline: str = BASELINE) -> str:
    """The markdown table; the ratio column is the baseline's p50 over the row's p50."""
    base = next((r.p50_ms for r in rows if r.name == baseline and r.p50_ms), None)
    lines = [
        "| group | figure | p50 ms | p95 ms | n | vs docker exec | note |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        ratio = "-"
        if base and r.p50_ms and r.compare:
            ratio = f"{base / r.p50_ms:.1f}x faster" if r.p50_ms <= base else f"{r.p50_ms / base:.1f}x slower"
            if r.name == baseline:
                ratio = "1x"
        lines.append(
            f"| {r.group} | {r.name} | {_ms(r.p50_ms)} | {_ms(r.p95_ms)} | {r.n} | {ratio} | {r.note} |"
        )
    return "\n".join(lines)


def print_table(rows: Sequence[Row], baseline: str = BASELINE) -> None:
    """Print ``render_table`` to stdout."""
    print(render_table(rows, baseline))
