"""The knobs of the dispatch pipeline; defaults are spec 000's."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dispatcher.core.call.ordering import Ordering
from dispatcher.core.text.display import SHOW_LIMIT
from dispatcher.core.text.result_size import RESULT_BUDGET_BYTES

__all__ = ["DispatcherConfig"]


@dataclass(frozen=True, slots=True)
class DispatcherConfig:
    """Knobs of the pipeline; defaults are spec 000's."""

    concurrency: int = 4
    default_timeout: float = 60.0
    execute_timeout: float = 600.0  # EXECUTE and NETWORK
    timeouts: Mapping[str, float] = field(default_factory=dict)
    """Per tool name: its limit in seconds (the ``timeouts:`` map of the config), over the above."""
    abandon_after: float = 30.0
    confirmation_timeout: float = 300.0
    result_budget_chars: int = 48_000
    confirmation_max_chars: int = SHOW_LIMIT
    """Longest input a confirmation request shows; a longer one needing approval is refused unseen."""
    result_budget_bytes: int = RESULT_BUDGET_BYTES
    """Most bytes one result may carry, images included; a bigger one is cut or an error result."""
    event_history: int = 10_000
    event_history_bytes: int = 8 << 20
    """Per session: the oldest events leave the replay history beyond this many (estimated) bytes."""
    ordering: Ordering = Ordering.CONCURRENT
    """How a message's calls run when its Dispatch does not say (``dispatch.ordering``)."""
    max_input_bytes: int = 6 << 20
    """Largest input_json of one tool_use; a bigger one is that call's validation error
    (``input_too_large``), never parsed. Holds a base64 ``write_file`` of ``max_write_bytes``."""
    max_write_bytes: int = (4 << 20) - (64 << 10)
    """Largest file one write_file writes (decoded bytes); stated in its description and errors.
    The request carrying it must also fit ``server.max_message_bytes`` (base64 adds a third)."""
    clock: Callable[[], float] = time.monotonic
    """What a call's durations (its events and audit records) are measured on, in seconds; unit
    tests step a fake one instead of waiting."""
    max_staged_changes: int = 64
    """Per review/audit session: files with a staged change (``core/staging/area.py``); a staging
    beyond is the call's error naming this key."""
    max_staged_bytes: int = 32 << 20
    """Per review/audit session: bytes its staged changes hold (content and diff)."""
