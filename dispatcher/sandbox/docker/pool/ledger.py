"""The warm pool's ledger: who holds each of its containers, and nothing else.

A pooled container is waiting (by key, reserved by no session), being made (for the session id it is
labelled for), reserved by a session (made, or still being made), adopted by its session (with its
slot, until the container is removed) or kept at start-up for its session to re-adopt. The ledger
only records these claims and answers from them; the pool (``warm_pool.py``) acts on its answers and
the filler (``filler.py``) tells it what it made.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from dispatcher.sandbox.container.host import AgentLink
from dispatcher.sandbox.docker.pool.shares import Key


@dataclass(slots=True)
class Pooled:
    """One container of the pool (or, once adopted, of its session until it is removed)."""

    container_id: str
    link: AgentLink
    slot: str
    key: Key
    session_id: str
    """The session it is labelled for: the one that reserves it, or none (removed unused)."""


MAKING = None
"""A claim whose container is still being made."""


class Ledger:
    """The claims on the pool's containers."""

    def __init__(self) -> None:
        self.ready: dict[Key, deque[Pooled]] = {}  # waiting, reserved by no session yet
        self.making: dict[str, Key] = {}  # session id -> key of each container being made
        self.claims: dict[str, Pooled | None] = {}  # reserved: session id -> its container
        self.dropped: set[str] = set()  # reserved while being made, then released: remove
        self.arrived = asyncio.Event()  # set whenever a fill ends (ready, or failed)
        self.adopted: dict[str, str] = {}  # container id -> slot, until the container is removed
        self.readopting: set[str] = set()  # kept at start-up for a session, not yet confirmed

    @property
    def waiting(self) -> int:
        """Containers waiting now, reserved by no session."""
        return sum(len(q) for q in self.ready.values())

    def unclaimed_making(self, key: Key | None = None) -> int:
        """Containers being made (for ``key``, or any) that no session has reserved yet."""
        return sum(1 for sid, k in self.making.items() if sid not in self.claims and key in (None, k))

    def reserve(self, key: Key) -> tuple[str, bool] | None:
        """The session id of a container for ``key``: a waiting one's (True: one fewer waits now),
        else one being made's, now reserved; None: there is none."""
        queue = self.ready.get(key)
        if queue:
            pooled = queue.popleft()
            self.claims[pooled.session_id] = pooled
            return pooled.session_id, True
        for session_id, making in self.making.items():
            if making == key and session_id not in self.claims:
                self.claims[session_id] = MAKING
                return session_id, False
        return None

    def reserved(self, session_id: str) -> bool:
        return session_id in self.claims

    def still_making(self, session_id: str) -> bool:
        """Whether the session's reserved container is still being made."""
        return self.claims.get(session_id, False) is MAKING

    def release(self, session_id: str) -> Pooled | None:
        """Drop the session's reservation; returns its container to remove, if it was made (one
        still being made is marked to be removed when it is)."""
        if session_id not in self.claims:
            return None
        pooled = self.claims.pop(session_id)
        if pooled is None:
            self.dropped.add(session_id)
        return pooled

    def claimed(self, session_id: str) -> Pooled | None:
        """Hand over the session's reserved container (None: it was never made)."""
        return self.claims.pop(session_id, None)

    def owns(self, container_id: str) -> bool:
        """Whether the container is the pool's (waiting, reserved or adopted, until it is removed)."""
        return (
            container_id in self.adopted
            or any(p.container_id == container_id for q in self.ready.values() for p in q)
            or any(p is not None and p.container_id == container_id for p in self.claims.values())
        )

    def made(self, pooled: Pooled) -> None:
        """A fill made ``pooled``: it goes to the session that reserved it meanwhile, or waits."""
        if pooled.session_id in self.claims:
            self.claims[pooled.session_id] = pooled
        else:
            self.ready.setdefault(pooled.key, deque()).append(pooled)

    def filled(self, session_id: str) -> None:
        """A fill ended; a reservation of a container that failed to be made is dropped (its
        session launches its own)."""
        self.making.pop(session_id, None)
        self.dropped.discard(session_id)
        if self.claims.get(session_id, False) is MAKING:
            del self.claims[session_id]
        self.arrived.set()

    def surplus(self, targets: dict[Key, int]) -> list[Pooled]:
        """Take out the waiting containers of keys past their target (counting those being made
        for no session), to be removed."""
        surplus: list[Pooled] = []
        for key, queue in self.ready.items():
            keep = max(0, targets.get(key, 0) - self.unclaimed_making(key))
            surplus.extend(list(queue)[keep:])
        for pooled in surplus:
            self.ready[pooled.key].remove(pooled)
        return surplus

    def clear(self) -> list[Pooled]:
        """Take out every waiting or reserved container (a stop), to be removed."""
        waiting = [p for q in self.ready.values() for p in q]
        waiting += [p for p in self.claims.values() if p is not None]
        self.ready.clear()
        self.claims.clear()
        return waiting
