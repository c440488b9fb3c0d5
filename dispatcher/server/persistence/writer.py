"""The background writer of ``state.db``: events, running calls, container ids and preview ports,
in batches.

The event loop only appends to a queue (``on_event`` is a bus sink, called inside ``publish``);
a thread turns what accumulated into one transaction every few milliseconds. On ``kill -9`` what
was still queued is lost: the last few milliseconds of events (and, with them, maybe the news that
a call started or ended). A graceful stop drains the queue first (``close``). A preview port's
change comes with a future the thread settles once it is committed, so OpenPort and ClosePort
answer only after what they changed would survive a kill (awaited off the loop).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

from dispatcher.core.events import bus as ev
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import ToolCalled, ToolConfirmationRequested, to_dict
from dispatcher.server.persistence.store import SessionStore, StoredPort

log = logging.getLogger("dispatcher.server.persistence.store")

BATCH_SECONDS = 0.005
"""How long the writer lets events gather after the first one before it commits them."""
MAX_QUEUED_BYTES = 8 << 20
"""Most (estimated) event bytes waiting for the thread. Beyond it output deltas are not stored
(their replay after a restart has a gap); every other event still is, so which calls ran and how
they ended stays true. A tenant printing faster than the disk writes cannot grow server memory by
more than this (live output flows for the whole run: 100 MiB of it must not cost 64 MiB here).
What is stored stays within each session's ``event_history_bytes``: the writer prunes as it goes,
so the file does not grow with the output either."""
_encode_payload = json.JSONEncoder(default=str).encode  # one encoder, not one per event
_TERMINAL = frozenset({ev.TOOL_COMPLETED, ev.TOOL_FAILED, ev.TOOL_INPUT_INVALID})


class StateWriter:
    """One thread that owns every write but the session rows' own insert and delete."""

    def __init__(
        self,
        store: SessionStore,
        *,
        history: int,
        history_bytes: int,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self._store = store
        self._max_queued_bytes = max_queued_bytes
        self._queued_bytes = 0  # events queued or being written (the thread subtracts when done)
        self._count_lock = threading.Lock()
        self._dropped = 0
        self._dropped_last: dict[str, int] = {}  # session -> seq of its latest unstored delta
        self._history = history
        self._history_bytes = history_bytes
        self._queue: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stopping = False
        self._live: set[str] = set()
        # Per session, what the stored history holds: (seq, size) oldest first, and its bytes;
        # it mirrors the bus's own bounds so the file keeps what memory keeps.
        self._kept: dict[str, deque[tuple[int, int]]] = {}
        self._kept_bytes: dict[str, int] = {}
        self._running: set[tuple[str, str]] = set()  # (session, tool_use_id) stored as running
        self._thread = threading.Thread(target=self._run, name="state-writer", daemon=True)
        self._thread.start()

    # -- called on the event loop -------------------------------------------------------------

    def track(self, session_id: str, events: Iterable[Event] = ()) -> None:
        """Start writing for a session (its row exists) whose stored history is ``events``."""
        with self._store.lock:
            self._live.add(session_id)
            kept = self._kept[session_id] = deque((e.seq, e.size) for e in events)
            self._kept_bytes[session_id] = sum(size for _, size in kept)

    def running_stored(self, session_id: str, tool_use_ids: Iterable[str]) -> None:
        """These calls of a session given back are stored as running (their end deletes them)."""
        with self._store.lock:
            self._running.update((session_id, tid) for tid in tool_use_ids)

    def forget(self, session_ids: Iterable[str]) -> None:
        """Stop writing for these sessions and delete their rows (CloseSession)."""
        ids = list(session_ids)
        with self._store.lock:
            for sid in ids:
                self._live.discard(sid)
                self._kept.pop(sid, None)
                self._kept_bytes.pop(sid, None)
            closed = set(ids)
            self._running = {key for key in self._running if key[0] not in closed}
        self._store.delete_sessions(ids)

    def live_ids(self) -> list[str]:
        """The sessions written for."""
        with self._store.lock:
            return list(self._live)

    def on_event(self, event: Event) -> None:
        """The bus sink: queue the event (cheap; the thread serialises it)."""
        with self._count_lock:
            if (
                event.type == ev.TOOL_OUTPUT_DELTA
                and self._queued_bytes + event.size > self._max_queued_bytes
            ):
                self._dropped += 1
                self._dropped_last[event.session_id] = event.seq  # seqs never go back after a restart
                if not self._wake.is_set():
                    self._wake.set()
                return
            self._queued_bytes += event.size
        self._queue.append(("event", event))
        if not self._wake.is_set():
            self._wake.set()

    def update(self, session_id: str, column: str, value: Any) -> None:
        """Queue a change of the session's ``container_id`` or ``policy`` (a JSON-able dict)."""
        if column in ("policy", "lifecycle", "processes"):
            value = json.dumps(value)
        self._queue.append(("update", session_id, column, value))
        self._wake.set()

    def port_changed(self, session_id: str, port: int, row: StoredPort | None) -> Future[None]:
        """Queue a preview port opened (``row``) or closed (None); the future is done once it is
        committed (or failed with the write's error). A session closed meanwhile has nothing to
        write: its rows went with it."""
        done: Future[None] = Future()
        if self._stopping:
            done.set_exception(RuntimeError("the session state is closed"))
            return done
        self._queue.append(("port", session_id, port, row, done))
        self._wake.set()
        return done

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until everything queued so far is committed (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue or not self._idle.is_set():
            self._wake.set()
            if time.monotonic() > deadline:
                return False
            self._idle.wait(0.01)
        return True

    def close(self) -> None:
        """Write what is queued, stop the thread and close the store."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=30)
        self._store.close()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._idle.clear()
            if not self._stopping:
                time.sleep(BATCH_SECONDS)  # let a burst gather into one transaction
            self._wake.clear()
            items: list[tuple[Any, ...]] = []
            while self._queue:
                items.append(self._queue.popleft())
            if items:
                failure: Exception | None = None
                try:
                    self._write(items)
                except Exception as exc:
                    failure = exc
                    log.exception("writing session state failed; %d changes lost", len(items))
                self._written(items)
                _settle(items, failure)
            self._idle.set()
            if self._stopping and not self._queue:
                return

    def _written(self, items: list[tuple[Any, ...]]) -> None:
        done = sum(item[1].size for item in items if item[0] == "event")
        with self._count_lock:
            self._queued_bytes -= done
            dropped, self._dropped = self._dropped, 0
        if dropped:
            log.warning(
                "state writer behind by %d MiB: %d output deltas not stored (replay after a restart has a gap)",
                self._max_queued_bytes >> 20,
                dropped,
            )

    def _write(self, items: list[tuple[Any, ...]]) -> None:
        with self._store.lock:
            rows: list[tuple[Any, ...]] = []
            pruned: dict[str, int] = {}
            calls: dict[tuple[str, str], tuple[str, str, str, str] | None] = {}
            last: dict[str, int] = {}
            updates: list[tuple[str, str, Any]] = []
            ports: list[tuple[str, int, StoredPort | None]] = []
            with self._count_lock:
                skipped, self._dropped_last = self._dropped_last, {}
            for sid, seq in skipped.items():
                if sid in self._live:
                    last[sid] = seq
            for item in items:
                if item[0] == "update":
                    if item[1] in self._live:
                        updates.append((item[1], item[2], item[3]))
                    continue
                if item[0] == "port":
                    if item[1] in self._live:
                        ports.append((item[1], item[2], item[3]))
                    continue
                event: Event = item[1]
                sid = event.session_id
                if sid not in self._live:
                    continue  # closed meanwhile: its rows are gone
                rows.append(
                    (
                        sid,
                        event.seq,
                        event.time,
                        event.turn_id,
                        event.tool_use_id,
                        event.type,
                        _encode_payload(to_dict(event.payload)),
                        event.size,
                    )
                )
                last[sid] = max(event.seq, last.get(sid, 0))
                self._keep(sid, event, pruned)
                key = (sid, event.tool_use_id)
                if event.type in _TERMINAL:
                    calls[key] = None
                elif (
                    isinstance(event.payload, ToolCalled | ToolConfirmationRequested)
                    and calls.get(key) is None
                ):
                    tool_name = event.payload.tool_name
                    calls[key] = (sid, event.tool_use_id, event.turn_id, tool_name)
            started: list[tuple[str, str, str, str]] = []
            ended: list[tuple[str, str]] = []
            for key, row in calls.items():
                if row is not None:
                    started.append(row)
                    self._running.add(key)
                elif key in self._running:  # stored by an earlier batch; one that started and
                    self._running.discard(key)  # ended within this batch never was
                    ended.append(key)
            self._store.write_batch(rows, pruned, started, ended, last, updates, ports)

    def _keep(self, sid: str, event: Event, pruned: dict[str, int]) -> None:
        kept = self._kept.setdefault(sid, deque())
        kept.append((event.seq, event.size))
        total = self._kept_bytes.get(sid, 0) + event.size
        while kept and (len(kept) > self._history or total > self._history_bytes):
            seq, size = kept.popleft()
            total -= size
            pruned[sid] = max(pruned.get(sid, 0), seq)
        self._kept_bytes[sid] = total


def _settle(items: list[tuple[Any, ...]], failure: Exception | None) -> None:
    """Tell whoever waits on a preview port's change that it is committed (or why not)."""
    for item in items:
        if item[0] == "port":
            done: Future[None] = item[4]
            if failure is None:
                done.set_result(None)
            else:
                done.set_exception(failure)
