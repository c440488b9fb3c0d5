"""How many bytes a directory tree takes on disk, as ``du`` counts them: a session's workspace for
its usage, a snapshot for its tenant's bound."""

from __future__ import annotations

import os

__all__ = ["MAX_ENTRIES", "tree_bytes"]

MAX_ENTRIES = 200_000
"""A tree is measured entry by entry; past this many the walk stops (the figure is a floor): a
usage request must not cost a scan of millions of files."""


def tree_bytes(root: str, max_entries: int | None = None) -> int:
    """Bytes allocated under ``root`` (st_blocks, as ``du``), symlinks not followed, each inode
    once; at most ``max_entries`` (default ``MAX_ENTRIES``) entries are looked at."""
    bound = MAX_ENTRIES if max_entries is None else max_entries
    seen: set[tuple[int, int]] = set()
    total = 0
    entries = 0
    stack = [root]
    while stack and entries < bound:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for entry in it:
                entries += 1
                if entries > bound:
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue  # a hard link counted once
                    seen.add(key)
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return total
