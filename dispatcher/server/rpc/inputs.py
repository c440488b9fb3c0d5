"""Parsing Dispatch inputs without letting one tenant's megabytes stall everyone's RPCs.

Small inputs (nearly all) are parsed inline: it takes microseconds. A request carrying more than
``INLINE_BYTES`` of input JSON costs milliseconds (a 4 MB input ~10-30 ms even with every bound
in place), which on the event loop would delay every other RPC of every tenant. Such a request is
parsed on one worker thread, and each tenant has at most one of them waiting for or using that
thread at a time: a tenant flooding big inputs queues behind itself, and the event loop only
awaits a future meanwhile.

Receiving a 4 MB message costs grpc itself a few ms on the event loop too, before any of our code
runs; so each tenant's big inputs are also paced to ``BIG_INPUT_BYTES_PER_SECOND``: a client that
sends them back to back (as a flood does, waiting for each answer) is slowed down to that rate,
and what its requests cost the server is bounded, whatever it sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dispatcher.core.types import ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert

INLINE_BYTES = 64 * 1024
"""Input JSON (summed over a request's tool_uses) parsed on the event loop; more goes to the worker."""
BIG_INPUT_BYTES_PER_SECOND = 64 << 20
"""Per tenant: big inputs beyond this rate wait their turn (smaller ones are never delayed)."""


@dataclass(eq=False)
class _TenantInputs:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    next_at: float = 0.0  # loop time before which this tenant's next big input waits


class InputParser:
    """Turns a request's ToolUse messages into domain blocks, big ones off the event loop."""

    def __init__(self, max_input_bytes: int | None = None) -> None:
        self._max_input_bytes = max_input_bytes  # per tool_use: over it, never parsed
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatcher-input")
        self._per_tenant: dict[str, _TenantInputs] = {}

    async def tool_uses(self, tenant_id: str, msgs: Sequence[pb.ToolUse]) -> list[ToolUseBlock]:
        """The blocks of ``msgs``; never raises for bad JSON (that becomes a validation result)."""
        size = sum(len(m.input_json) for m in msgs)
        if size <= INLINE_BYTES:
            return convert.tool_uses_from_pb(msgs, self._max_input_bytes)
        state = self._per_tenant.setdefault(tenant_id, _TenantInputs())
        loop = asyncio.get_running_loop()
        async with state.lock:
            delay = state.next_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            blocks = await loop.run_in_executor(
                self._worker, convert.tool_uses_from_pb, msgs, self._max_input_bytes
            )
            state.next_at = loop.time() + size / BIG_INPUT_BYTES_PER_SECOND
        return blocks

    def close(self) -> None:
        """Stop the worker thread (waits for a parse in progress)."""
        self._worker.shutdown(wait=True, cancel_futures=True)
