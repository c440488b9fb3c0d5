"""How the calls of one assistant message run relative to each other (``DispatchRequest.ordering``).

Spec 000 §4.1 runs them all at once. A model that writes a file and then runs it in one message
expects order, so a caller may ask for it: ``sequential`` (each call after the one before it) or
``reads_concurrent`` (NONE and READ calls at once; a WRITE, EXECUTE or NETWORK call after every call
before it has ended, and the calls after it after it). The per-session concurrency cap applies in
every ordering.

A call waits at its gate after lookup and validation (pure, no I/O) and before anything touches
the sandbox or asks a human, so a later call sees what the earlier ones did: paths are resolved,
and confirmations asked, once the calls it depends on have ended.

Plan mode numbers its steps in message order whatever the ordering: there a call with side effects
waits for every call before it (as in ``reads_concurrent``) before it is proposed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from enum import StrEnum

from dispatcher.core.types import SideEffect

__all__ = ["MessageOrder", "Ordering", "parse_ordering"]

CHANGES = frozenset({SideEffect.WRITE, SideEffect.EXECUTE, SideEffect.NETWORK})
"""The side-effect classes a later call may depend on."""


class Ordering(StrEnum):
    """The orderings a Dispatch may ask for; the server's default is ``dispatch.ordering``."""

    CONCURRENT = "concurrent"
    SEQUENTIAL = "sequential"
    READS_CONCURRENT = "reads_concurrent"


def parse_ordering(name: str) -> Ordering:
    """The ordering named ``name`` (any case).

    Raises:
        ValueError: unknown name, listing the known ones.
    """
    try:
        return Ordering(name.lower())
    except ValueError:
        raise ValueError(f"unknown ordering {name!r} (one of {[o.value for o in Ordering]})") from None


class MessageOrder:
    """The gates of one message's calls: which earlier calls each one waits for.

    ``changes[i]``: call i's tool has a side effect a later call may depend on (an unknown tool
    does not). Built once per message; each call reports its end with ``ended``.
    """

    def __init__(self, ordering: Ordering, changes: Sequence[bool]) -> None:
        self.ordering = ordering
        self._changes = tuple(changes)
        self._ended = [asyncio.Event() for _ in self._changes]

    def __len__(self) -> int:
        return len(self._changes)

    def ended(self, index: int) -> None:
        """Call ``index`` has ended (result ready, or it never ran): the calls after it may go."""
        self._ended[index].set()

    def waits_for(self, index: int, *, plan: bool = False) -> list[int]:
        """The earlier calls call ``index`` must see end first (``plan``: the session is in plan
        mode, where a call with side effects is proposed only after the earlier ones were)."""
        earlier = range(index)
        if self.ordering is Ordering.SEQUENTIAL:
            return list(earlier)
        if self._changes[index] and self.ordering is Ordering.READS_CONCURRENT:
            return list(earlier)
        if self.ordering is Ordering.READS_CONCURRENT or (plan and self._changes[index]):
            return [k for k in earlier if self._changes[k]]
        return []

    async def wait(self, index: int, *, plan: bool = False) -> None:
        """Until every call in ``waits_for(index)`` has ended."""
        for k in self.waits_for(index, plan=plan):
            await self._ended[k].wait()
