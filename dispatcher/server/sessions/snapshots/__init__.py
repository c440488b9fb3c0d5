"""Snapshots of sessions and forks (``SnapshotSession``, ``ListSnapshots``, ``DeleteSnapshot``,
``CreateSession{snapshot_id}``, ``ForkSession``).

A snapshot is two directories under ``<home>/snapshots/<tenant>/<id>/``: ``workspace/`` and
``tmp/`` (the sandbox's tmpfs, ``$HOME`` inside it), copied while the sandbox is held still
(``SandboxProvider.capture``: frozen for the copy, or already paused), and one ``state.db`` row,
written once the files are complete: a directory without a row is an interrupted copy, removed at
start. Memory and processes are not kept. A fork is a snapshot nobody names, copied into each
child and removed.

A copy out of a session is bounded while it is written (``sandbox/tree_copy.py``): its budget is
what the tenant's ``max_snapshot_bytes`` leaves (its snapshots and the forks' copies under way
counted) and ``max_snapshot_entries``; past either it stops, is removed, and the request is
RESOURCE_EXHAUSTED. Copies from a snapshot into a new session use ``cp --reflink=auto``
(copy-on-write where the filesystem offers it): their source was bounded when it was taken.

``service.py`` (``Snapshots``: what the RPCs call; taking a snapshot, a session from one),
``records.py`` (the rows, the directories, the bytes they hold and who reads them), ``copies.py``
(a session copied out within the bounds, a copy into a new session), ``forks.py`` (ForkSession).
"""

from __future__ import annotations

from dispatcher.server.sessions.snapshots.forks import MAX_FORK
from dispatcher.server.sessions.snapshots.service import Snapshots
from dispatcher.wire.convert_snapshots import ForkFailure, SnapshotInfo

__all__ = ["MAX_FORK", "ForkFailure", "SnapshotInfo", "Snapshots"]
