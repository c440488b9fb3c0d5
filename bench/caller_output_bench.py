"""The caller's own output (issue 37 item 1): a ``shell`` printing 3 MB and 100 MB through
``Dispatch`` on Docker, every byte of it read by the calling client.

Each row is one call: the throughput of ``tool.output_delta`` text the client received, whether
it is exactly what the command printed (the bytes in order: its sha256, and no skip marker), and the
peak RSS of the ``dispatcher serve`` process during the call (sampled every 20 ms; what the server
holds for a caller that reads is bounded, so it must not grow with the output). The "slow reader"
row stops reading for a while at its first delta, as a busy client would, over a channel whose
HTTP/2 window stays at 64 KiB (no bandwidth probing), so what it has not read cannot pile up in the
transport: the command waits for it instead of the caller losing output.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.env import BenchEnv
from bench.grpc_bench import _docker_answers, _start_server, _stop_server
from bench.table import Row
from dispatcher.client import AsyncDispatcherClient
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import ToolOutputDelta
from dispatcher.core.types import ToolResultBlock, ToolUseBlock

GROUP = "caller output"
MIB = 1 << 20
LINE = 10  # "%09.0f\n": nine digits and a newline
SLOW_PAUSE_S = 2.0


def command(lines: int) -> str:
    """A command printing ``lines`` numbered lines of ``LINE`` bytes, then one ``x``."""
    return f"seq -f '%09.0f' 1 {lines}; printf x"


def expected_digest(lines: int) -> tuple[int, str]:
    """(bytes, sha256) of what ``command(lines)`` prints."""
    digest = hashlib.sha256()
    step = 100_000
    for start in range(1, lines + 1, step):
        stop = min(lines, start + step - 1)
        digest.update("".join(f"{i:09d}\n" for i in range(start, stop + 1)).encode())
    digest.update(b"x")
    return lines * LINE + 1, digest.hexdigest()


@dataclass
class Received:
    """What the caller got of one call's stdout."""

    bytes: int = 0
    deltas: int = 0
    sha256: str = ""
    is_error: bool = True
    seconds: float = 0.0


async def dispatch_and_read(
    client: AsyncDispatcherClient, session_id: str, cmd: str, *, pause: float = 0.0
) -> Received:
    """Run ``cmd`` with ``shell`` and read its whole stream, hashing the stdout deltas in order;
    ``pause``: seconds the reader stops at its first delta (a busy client)."""
    digest = hashlib.sha256()
    got = Received()
    started = time.perf_counter()
    uses = [ToolUseBlock("tu_out", "shell", {"command": cmd, "timeout_seconds": 600})]
    async for item in client.dispatch(session_id, uses):
        if isinstance(item, Event) and isinstance(item.payload, ToolOutputDelta):
            if item.payload.stream != "stdout":
                continue
            data = item.payload.text.encode("utf-8", "surrogatepass")
            got.bytes += len(data)
            got.deltas += 1
            digest.update(data)
            if pause and got.deltas == 1:
                await asyncio.sleep(pause)
        elif isinstance(item, ToolResultBlock):
            got.is_error = item.is_error
    got.seconds = time.perf_counter() - started
    got.sha256 = digest.hexdigest()
    return got


class RssPeak:
    """The highest RSS of a process, sampled on a thread while it is open."""

    def __init__(self, pid: int, every: float = 0.02) -> None:
        self._pid = pid
        self._every = every
        self._stop = threading.Event()
        self.peak = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self._pid))
            self._stop.wait(self._every)

    def __enter__(self) -> RssPeak:
        self.peak = rss(self._pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def measure(env: BenchEnv) -> list[Row]:
    """3 MB and 100 MB through Dispatch, each to a fast and to a small-window reader, one call each."""
    if not _docker_answers():
        return [Row(GROUP, "(skipped)", None, note="needs Docker and the sandbox image")]
    token = secrets.token_urlsafe(24)
    proc, target = _start_server(env, token, "docker")
    rows: list[Row] = []
    try:
        small_window = grpc.aio.insecure_channel(
            target, options=[("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", 64 << 20)]
        )
        async with (
            AsyncDispatcherClient(target, token=token, timeout=None) as client,
            AsyncDispatcherClient(token=token, channel=small_window, timeout=None) as slow,
        ):
            session = await client.create_session("caller-output")
            sid = session.session_id
            await dispatch_and_read(client, sid, "true")  # the container is up before timing
            for name, lines, reader, pause in (
                ("3 MB shell output through Dispatch", 300_000, client, 0.0),
                (f"3 MB, 64 KiB window, reader stops {SLOW_PAUSE_S:g} s", 300_000, slow, SLOW_PAUSE_S),
                ("100 MB shell output through Dispatch", 10_000_000, client, 0.0),
                ("100 MB, 64 KiB window", 10_000_000, slow, 0.0),
            ):
                size, want = expected_digest(lines)
                before = rss(proc.pid)
                with RssPeak(proc.pid) as peak:
                    got = await dispatch_and_read(reader, sid, command(lines), pause=pause)
                whole = got.bytes == size and got.sha256 == want and not got.is_error
                rows.append(
                    Row(
                        GROUP,
                        name,
                        got.seconds * 1000,
                        n=1,
                        note=(
                            f"{got.bytes / MIB / got.seconds:.1f} MiB/s; received {got.bytes:,} of"
                            f" {size:,} bytes{'' if whole else ' (NOT WHOLE)'}; server RSS"
                            f" {before / MIB:.0f} -> peak {peak.peak / MIB:.0f} MiB"
                        ),
                        compare=False,
                    )
                )
        await small_window.close()
    finally:
        _stop_server(proc)
    return rows
