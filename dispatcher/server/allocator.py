"""The C allocator of a long-running server: large buffers go back to the system when freed.

Why. A server's Python objects stay within their bounds under a repeated load (tracemalloc between
rounds of 150 shell calls printing 1 MB each and 40 Dispatches with a 3.5 MB ``turn_id``: the traced
heap is the same after every round), yet its RSS grew from round to round, and by different
amounts in different runs. What held it was glibc's malloc, not a Python object:

- its mmap threshold is dynamic: once a large block (a 1 MB output, a 3.5 MB request) is freed
  from an mmap, blocks up to that size come from the heap instead, where a freed one leaves a hole
  that is reused only by what fits and returned to the system only from the heap's top;
- each thread that allocates (gRPC's, the state writer's, the executor's) may get its own arena,
  up to 8 per core, each keeping such holes.

So a server fixes the threshold (blocks of ``MMAP_THRESHOLD`` and more are mapped and unmapped on
their own, never left in a heap) and caps the arenas, once, before its threads start. Elsewhere
(musl, macOS, a libc without ``mallopt``) nothing is changed. The environment's
``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_ARENA_MAX`` (an operator's choice) wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD = 256 << 10
"""Blocks this large or larger are their own mapping (a 1 MB delta, a large request)."""
TRIM_THRESHOLD = 1 << 20
"""Free memory at a heap's top beyond this goes back to the system."""
ARENA_MAX = 2
"""Arenas the threads share (the event loop's thread does nearly all the work)."""


def bound_allocator() -> bool:
    """Apply the settings above to glibc's malloc; False where there is no glibc (or it refused)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = all(
        mallopt(option, value) == 1
        for option, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
            (M_ARENA_MAX, ARENA_MAX),
        )
    )
    if not done:
        log.warning("the C allocator refused its bounds (mallopt); memory freed may stay with the process")
    return done
