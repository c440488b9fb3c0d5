"""Copying a container's ``/tmp`` (a tmpfs, which ``docker cp`` cannot see) out of it and into
another, from the host through ``/proc/PID/root``: for snapshots and forks.

The copy is ``tree_copy.py``'s: through directory descriptors with ``O_NOFOLLOW`` (a symlink a
sandbox left in ``/tmp`` is copied as a symlink and never followed, so nothing outside the
container's ``/tmp`` is read or written whatever it points at), and bounded by a budget as it goes.
A copy out is taken with the container frozen (nothing in it can swap a directory for a link
meanwhile) and charges the snapshot's or fork's budget; a copy in goes into a container no session
command ran in yet, from a copy that was bounded when it was taken.
"""

from __future__ import annotations

import os
import sys

from dispatcher.core.provider_api import CopyBudget
from dispatcher.sandbox.tree_copy import copy_tree

__all__ = ["copy_in", "copy_out"]


def copy_out(pid: int, dest: str, budget: CopyBudget) -> int:
    """Copy the ``/tmp`` of the process ``pid``'s container into the new directory ``dest``,
    charging ``budget``; returns the bytes of file data copied.

    Raises:
        CopyBudgetExceeded: it would pass ``budget`` (the caller removes ``dest``).
        OSError: the copy failed.
    """
    os.makedirs(dest, mode=0o700)
    return copy_tree(f"/proc/{pid}/root/tmp", dest, budget, label="tmp")


def copy_in(source: str, pid: int) -> int:
    """Copy the directory ``source``'s contents into the ``/tmp`` of ``pid``'s container. No
    budget of its own: ``source`` is a copy that was bounded when it was taken (the container's
    tmpfs has its size besides).

    Raises:
        OSError: the copy failed.
    """
    return copy_tree(source, f"/proc/{pid}/root/tmp", CopyBudget(sys.maxsize, sys.maxsize), label="tmp")
