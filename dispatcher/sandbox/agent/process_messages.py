"""The process table's messages: background processes the host starts, lists, reads, writes,
signals and follows (``table.py`` serves them).

Part of the agent protocol's one schema: ``protocol.py`` re-exports every name here and lists the
requests among its ops, so the host imports ``protocol.py`` alone, as for every other op.

A process is named by ``process_id``, chosen by the host (``p_…``) or its caller; starting the
same id with the same command again answers the existing record (a retried call starts one
process), with another command it is a ``conflict``. Output is counted on one cursor per process
(both streams' bytes, in the order the agent read them); reads and watches start ``after`` a
cursor and say how many bytes they ``lost`` (fell out of the ring before anyone read them).

- ``proc_start`` → ``ProcInfo`` (the new record); ``proc_list`` → ``ProcList``.
- ``proc_read`` → ``ProcOutput``: the output after a cursor, at most ``max_bytes``, waiting up to
  ``wait_seconds`` for some (or the end) when there is none yet.
- ``proc_watch``: ``proc_data`` frames (on the watch's request id, like exec's ``output``) as the
  output comes, then the record (``ProcInfo``) once the process ended and every byte went out,
  or once ``proc_unwatch`` names the watch.
- ``proc_input`` → ``ProcInfo``: bytes for its stdin (buffered up to the agent's bound), and/or
  close it. ``proc_signal`` → ``ProcInfo``: a signal to the whole process group; with
  ``grace_seconds``, ``SIGKILL`` follows if the group outlives it, and the answer comes once the
  group is empty (or the kill was not enough).

Errors: ``no_process`` (unknown id), ``conflict`` (the id names another command), ``too_many``
(the running-process bound), ``too_large`` (a ring or stdin bound), ``not_running`` (stdin of a
process that ended).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .codec import CHUNK, OMIT_DEFAULT, BadMessage, Count, Done, Env, Reply, Request, check_env, take

PROCESS_STATES = ("running", "exited", "killed")
ORIGINS = ("background", "left")
"""How a process entered the table: started by ``proc_start``, or left running by an exec."""
PROCESS_SIGNALS = ("TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2")
MAX_READ = 1 << 20
"""The most output one ``proc_read`` returns."""
MAX_WAIT_SECONDS = 600.0
_PROCESS_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
STREAMS = ("stdout", "stderr")


def check_process_id(process_id: str) -> None:
    if not _PROCESS_ID.fullmatch(process_id):
        raise BadMessage("malformed process id (letters, digits, '_.:-', at most 64)")


@dataclass(frozen=True)
class ProcInfo(Reply):
    """One process of the table. ``end``: the cursor after its newest output byte; ``first``: the
    oldest one its ring still holds. Exactly one of ``exit_code`` and ``signal`` once it ended,
    except for a group an exec left running, whose leader was not the agent's child (neither)."""

    process_id: str
    command: str
    cwd: str
    pid: Count
    state: str
    exit_code: int | None
    signal: int | None
    started: float
    ended: float | None
    tool_use_id: str | None
    end: Count
    first: Count
    ring_bytes: Count
    stdin_open: bool
    origin: str

    def check(self) -> None:
        check_process_id(self.process_id)
        if self.state not in PROCESS_STATES or self.origin not in ORIGINS or self.first > self.end:
            raise BadMessage("malformed process record")
        if self.exit_code is not None and self.signal is not None:
            raise BadMessage("process record with both an exit status and a signal")
        if self.state == "running" and (self.exit_code, self.signal, self.ended) != (None, None, None):
            raise BadMessage("running process record with an end")


@dataclass(frozen=True)
class ProcList(Reply):
    """Every process of the table, oldest first; the records travel as a JSON array in the payload."""

    processes: tuple[ProcInfo, ...]

    def encode(self) -> tuple[dict[str, Any], bytes]:
        return {}, json.dumps([p.encode()[0] for p in self.processes]).encode("ascii")

    @classmethod
    def decode(cls, header: Mapping[str, Any], payload: bytes = b"") -> ProcList:
        try:
            raw = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise BadMessage("process list is not JSON") from None
        if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
            raise BadMessage("process list is not an array of objects")
        return cls(tuple(ProcInfo.decode(item) for item in raw))


@dataclass(frozen=True)
class ProcChunk:
    """Output of one stream from ``cursor`` on."""

    stream: str
    cursor: int
    data: bytes


@dataclass(frozen=True)
class ProcOutput(Reply):
    """Output after the cursor asked: ``chunks`` in order and contiguous (their bytes are the
    payload, their stream, cursor and length the header's ``pieces``), ``next`` the cursor to ask
    from next, ``lost`` the bytes between the cursor asked and the first returned that the ring no
    longer held; and the process's state then."""

    chunks: tuple[ProcChunk, ...]
    next: Count
    lost: Count
    state: str
    exit_code: int | None
    signal: int | None

    def encode(self) -> tuple[dict[str, Any], bytes]:
        header = {
            "pieces": [[c.stream, c.cursor, len(c.data)] for c in self.chunks],
            "next": self.next,
            "lost": self.lost,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
        }
        return header, b"".join(c.data for c in self.chunks)

    @classmethod
    def decode(cls, header: Mapping[str, Any], payload: bytes = b"") -> ProcOutput:
        pieces = header.get("pieces")
        if type(pieces) is not list:
            raise BadMessage("field 'pieces' must be a list")
        chunks, offset = [], 0
        for piece in pieces:
            ok = type(piece) is list and len(piece) == 3 and piece[0] in STREAMS
            if not ok or type(piece[1]) is not int or type(piece[2]) is not int or piece[2] <= 0:
                raise BadMessage("malformed output piece")
            chunks.append(ProcChunk(piece[0], piece[1], payload[offset : offset + piece[2]]))
            offset += piece[2]
        if offset != len(payload):
            raise BadMessage("output pieces do not add up to the payload")
        message = cls(
            tuple(chunks),
            take(header, "next", "Count"),
            take(header, "lost", "Count"),
            take(header, "state", "str"),
            take(header, "exit_code", "int | None"),
            take(header, "signal", "int | None"),
        )
        message.check()
        return message

    def check(self) -> None:
        if self.state not in PROCESS_STATES:
            raise BadMessage("malformed process state")
        position = self.chunks[0].cursor if self.chunks else self.next
        for chunk in self.chunks:
            if chunk.cursor != position:
                raise BadMessage("output pieces are not contiguous")
            position += len(chunk.data)
        if position != self.next:
            raise BadMessage("output pieces do not end at the next cursor")


@dataclass(frozen=True)
class ProcData(Reply):
    """A watch's output frame: ``data`` of ``stream`` from ``cursor``, after ``lost`` bytes the
    watcher missed (the ring dropped them before this frame could go out)."""

    TYPE: ClassVar[str] = "proc_data"
    stream: str
    cursor: Count
    data: bytes
    lost: Count = field(default=0, metadata=OMIT_DEFAULT)

    def check(self) -> None:
        if self.stream not in STREAMS or not 0 < len(self.data) <= CHUNK:
            raise BadMessage("malformed process output frame")


@dataclass(frozen=True)
class ProcStart(Request[ProcInfo], op="proc_start", reply=ProcInfo):
    """Start ``sh -c command`` in the background, in its own process group, with a stdin pipe.
    ``ring_bytes``: its output ring (None: the agent's default; at most its bound)."""

    process_id: str
    command: str
    cwd: str = "."
    env: Env = field(default_factory=dict)
    tool_use_id: str | None = None
    ring_bytes: int | None = None
    approved_cwd: str | None = None

    def check(self) -> None:
        check_process_id(self.process_id)
        check_env(self.env)
        if "\x00" in self.command:
            raise BadMessage("command contains a NUL byte")
        if self.ring_bytes is not None and self.ring_bytes <= 0:
            raise BadMessage("field 'ring_bytes' must be positive")


@dataclass(frozen=True)
class ProcListRequest(Request[ProcList], op="proc_list", reply=ProcList):
    """Every process of the table (running and the finished ones it keeps)."""


@dataclass(frozen=True)
class ProcRead(Request[ProcOutput], op="proc_read", reply=ProcOutput):
    """Output after cursor ``after``; with ``wait_seconds``, waits that long at most for some."""

    process_id: str
    after: Count = 0
    wait_seconds: float = 0.0
    max_bytes: Count = CHUNK

    def check(self) -> None:
        check_process_id(self.process_id)
        if not 0 <= self.wait_seconds <= MAX_WAIT_SECONDS or not 0 < self.max_bytes <= MAX_READ:
            raise BadMessage("wait_seconds or max_bytes out of bounds")

    def check_reply(self, reply: Any) -> None:
        if sum(len(c.data) for c in reply.chunks) > self.max_bytes:
            raise BadMessage("process output longer than was asked")
        if reply.chunks and reply.chunks[0].cursor != max(self.after, 0) + reply.lost:
            raise BadMessage("process output does not start where it was asked")


@dataclass(frozen=True)
class ProcWatch(Request[ProcInfo], op="proc_watch", reply=ProcInfo):
    """Follow the output from ``after`` (``proc_data`` frames), then the record once it ended."""

    process_id: str
    after: Count = 0

    def check(self) -> None:
        check_process_id(self.process_id)


@dataclass(frozen=True)
class ProcUnwatch(Request[Done], op="proc_unwatch", reply=Done):
    """End the watch that request ``watch`` began (it answers with the record at once)."""

    watch: int


@dataclass(frozen=True)
class ProcInput(Request[ProcInfo], op="proc_input", reply=ProcInfo):
    """Bytes for the process's stdin; ``close``: close it after them."""

    process_id: str
    data: bytes
    close: bool = False

    def check(self) -> None:
        check_process_id(self.process_id)


@dataclass(frozen=True)
class ProcSignal(Request[ProcInfo], op="proc_signal", reply=ProcInfo):
    """``signal`` to the process group; with ``grace_seconds``, ``SIGKILL`` after it (a stop)."""

    process_id: str
    signal: str = "TERM"
    grace_seconds: float | None = None

    def check(self) -> None:
        check_process_id(self.process_id)
        if self.signal not in PROCESS_SIGNALS:
            raise BadMessage(f"unknown signal {self.signal!r}")
        if self.grace_seconds is not None and not 0 <= self.grace_seconds <= MAX_WAIT_SECONDS:
            raise BadMessage("grace_seconds out of bounds")


PROCESS_REQUESTS = (ProcStart, ProcListRequest, ProcRead, ProcWatch, ProcUnwatch, ProcInput, ProcSignal)
