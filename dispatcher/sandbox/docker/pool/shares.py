"""How a warm pool's ``size`` is shared among those it makes containers for.

A key is (tenant id, sandbox ``uid:gid``): a pooled container is made for one tenant's session and
runs as one user for life. The size is shared among the keys of the latest asks (new sessions
that could adopt one), in proportion, largest remainders first, ties to the most recent. The window
is at least ``DEMAND_WINDOW`` asks (4 x size if larger), so one ask moves at most one share instead
of evicting another key's containers; until sessions ask, the configured tenants stand in for them.
"""

from __future__ import annotations

from collections import deque

Key = tuple[str, str]
"""(tenant id, sandbox ``uid:gid``): whom a pooled container is made for."""

DEMAND_WINDOW = 16
"""The size is shared among the keys of at least this many latest asks (4 x size if larger)."""


class Shares:
    """The latest asks and the containers per key they call for."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._demand: deque[Key] = deque(maxlen=max(DEMAND_WINDOW, 4 * size))  # oldest first
        self._asked = False

    def expect(self, keys: list[Key]) -> bool:
        """Before any ask, let ``keys`` (the configured tenants, first listed first) fill the window
        in turn; False, changing nothing, once a session has asked (or with no keys)."""
        if not keys or self._asked:
            return False
        window = self._demand.maxlen or 1
        self._demand.clear()
        self._demand.extend(reversed([keys[i % len(keys)] for i in range(window)]))
        return True

    def ask(self, key: Key) -> None:
        """A session of ``key`` asked for a container (adopted one or not)."""
        self._asked = True
        self._demand.append(key)

    def targets(self) -> dict[Key, int]:
        """Containers per key; empty when no tenant is known and nobody asked (nothing to make)."""
        if not self._demand:
            return {}
        counts: dict[Key, int] = {}
        for key in reversed(self._demand):  # most recent first: ties go to it
            counts[key] = counts.get(key, 0) + 1
        total = len(self._demand)
        targets = {k: self.size * c // total for k, c in counts.items()}
        left = self.size - sum(targets.values())
        for key in sorted(counts, key=lambda k: -(self.size * counts[k] % total))[:left]:
            targets[key] += 1
        return targets
