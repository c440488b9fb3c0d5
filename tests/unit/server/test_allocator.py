"""The server's C allocator bounds: a large block freed goes back to the system (glibc only)."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from dispatcher.server import allocator


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"
        )
    ]  # fmt: skip


def _libc() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    if name is None:
        pytest.skip("no C library found")
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallinfo2") or not hasattr(libc, "mallopt"):
        pytest.skip("not glibc 2.33 or later")
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def test_after_a_large_block_was_freed_the_next_large_one_is_still_its_own_mapping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    libc = _libc()
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    # glibc's dynamic threshold: freeing an 8 MiB mapping lets blocks up to 8 MiB into the heap.
    libc.free(libc.malloc(8 << 20))

    assert allocator.bound_allocator()

    libc.malloc_trim(0)  # the heaps' free tops go back, so the next block cannot come from one
    mapped = libc.mallinfo2().hblks
    block = libc.malloc(4 << 20)
    try:
        assert libc.mallinfo2().hblks == mapped + 1  # mapped on its own: unmapped when freed
    finally:
        libc.free(block)
    assert libc.mallinfo2().hblks == mapped


def test_an_operators_malloc_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not allocator.bound_allocator()
