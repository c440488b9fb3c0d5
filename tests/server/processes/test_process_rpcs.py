"""Issue 32, part 4: ListProcesses, WatchProcess, WriteProcessInput and SignalProcess through a
real gRPC server, against a session's process table (``memory_table.py``): tenancy, unknown
processes, a watch from a cursor with its loss and its end, a watch the client leaves, the watch
stream bound, stdin and its bound, signals, a sandbox without a table, a paused session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from dispatcher.client import AsyncDispatcherClient, OutputChunk, ProcessInfo, ProcessTruncated, RequestFailed
from dispatcher.config import hash_token
from dispatcher.server.sessions import processes as session_processes
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from dispatcher.wire.convert_processes import WatchItem
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA
from tests.server.helpers import until
from tests.server.processes.conftest import ProcHarness, start_proc_server
from tests.server.processes.memory_table import RING_BYTES, STDIN_LIMIT


async def _session(procs: ProcHarness, *process_ids: str) -> tuple[AsyncDispatcherClient, str]:
    client = procs.harness.client()
    sid = (await client.create_session("procs")).session_id
    for pid in process_ids:
        await procs.start(sid, pid)
    return client, sid


async def _code(aw: Any) -> str:
    with pytest.raises(RequestFailed) as err:
        await aw
    return err.value.code + ": " + err.value.details


async def _collect(client: AsyncDispatcherClient, sid: str, pid: str, **kw: Any) -> list[WatchItem]:
    return [item async for item in client.watch_process(sid, pid, **kw)]


async def test_list_gives_the_records_and_another_tenant_finds_no_session(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1", "p_2")
    await procs.table(sid).emit("p_1", "stdout", b"hello\n")
    await procs.table(sid).finish("p_2", 3)
    listed = await client.list_processes(sid)
    assert [p.process_id for p in listed] == ["p_1", "p_2"]
    one, two = listed
    assert (one.state, one.command, one.end, one.first, one.tool_use_id, one.origin) == (
        "running",
        "serve",
        6,
        0,
        "tu_p_1",
        "background",
    )
    assert one.stdin_open and one.ended is None and one.exit_code is None and one.pid > 0
    assert (two.state, two.exit_code, two.signal) == ("exited", 3, None) and two.ended is not None
    # Another tenant: the session does not exist, for every process RPC.
    beta = procs.harness.client(TOKEN_BETA)
    for attempt in (
        beta.list_processes(sid),
        beta.write_process_input(sid, "p_1", b"x"),
        beta.signal_process(sid, "p_1", "KILL"),
        _collect(beta, sid, "p_1"),
    ):
        assert (await _code(attempt)).startswith("NOT_FOUND: no session")
    assert procs.table(sid).signals_of("p_1") == [] and procs.table(sid).stdin_of("p_1") == b""


async def test_an_unknown_process_is_not_found_and_a_missing_id_invalid(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    for attempt in (
        _collect(client, sid, "p_nope"),
        client.write_process_input(sid, "p_nope", b"x"),
        client.signal_process(sid, "p_nope"),
    ):
        message = await _code(attempt)
        assert message.startswith("NOT_FOUND") and "p_nope" in message
    assert (await _code(client.signal_process(sid, ""))).startswith("INVALID_ARGUMENT: process_id")
    assert (await _code(_collect(client, sid, "p" * 300))).startswith("INVALID_ARGUMENT: process_id")
    await procs.table(sid).emit("p_1", "stdout", b"12345")
    message = await _code(_collect(client, sid, "p_1", after=6))
    assert message.startswith("INVALID_ARGUMENT: after: 6") and "ends at cursor 5" in message


async def test_a_watch_from_a_cursor_reports_what_the_ring_lost_then_the_exit(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    table = procs.table(sid)
    await table.emit("p_1", "stdout", b"a" * 200)
    await table.emit("p_1", "stderr", b"E" * 100)  # 300 bytes: the ring keeps the last 256
    await table.finish("p_1", 7)
    items = await _collect(client, sid, "p_1", after=10)
    lost = 300 - RING_BYTES - 10
    assert items[0] == ProcessTruncated(lost=lost, cursor=300 - RING_BYTES)
    chunks = [i for i in items if isinstance(i, OutputChunk)]
    assert [(c.stream, c.cursor, len(c.data)) for c in chunks] == [
        ("stdout", 44, 156),
        ("stderr", 200, 100),
    ]
    end = items[-1]
    assert isinstance(end, ProcessInfo) and (end.state, end.exit_code, end.end) == ("exited", 7, 300)
    # From a cursor the ring still holds: no loss, only what follows it.
    again = await _collect(client, sid, "p_1", after=250)
    assert [(type(i).__name__, getattr(i, "cursor", None)) for i in again] == [
        ("OutputChunk", 250),
        ("ProcessInfo", None),
    ]
    assert isinstance(again[0], OutputChunk) and again[0].data == b"E" * 50


async def test_a_watch_follows_live_and_ends_when_the_client_leaves(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    table = procs.table(sid)
    await table.emit("p_1", "stdout", b"old\n")
    seen: list[WatchItem] = []
    got_new = asyncio.Event()

    async def follow() -> None:
        async for item in client.watch_process(sid, "p_1", from_end=True):
            seen.append(item)
            got_new.set()

    task = asyncio.create_task(follow())
    await until(lambda: table.watching == 1, "the watch to start")
    await table.emit("p_1", "stderr", b"new\n")
    await asyncio.wait_for(got_new.wait(), 10)
    assert seen == [OutputChunk("stderr", 4, b"new\n")]  # from the end: not the old line
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await until(lambda: table.watching == 0, "the server to close the watch of a client that left")


async def test_watch_streams_count_with_watch_session_against_the_bound(tmp_path: Path) -> None:
    procs, harness = await start_proc_server(
        tmp_path,
        tenants=[
            {
                "id": "alpha",
                "token_sha256": [hash_token(TOKEN_ALPHA)],
                "workspace_root": str(tmp_path / "ws-alpha"),
                "quotas": {"max_watch_streams": 2},
            }
        ],
    )
    try:
        client, sid = await _session(procs, "p_1")
        table = procs.table(sid)
        session_watch = client.watch(sid)
        process_watch = client.watch_process(sid, "p_1")

        async def drain(it: Any) -> None:
            async for _ in it:
                pass

        tasks = [asyncio.create_task(drain(session_watch)), asyncio.create_task(drain(process_watch))]
        await until(lambda: table.watching == 1, "the process watch to start")
        admission = harness.server.sessions.admission
        await until(lambda: admission._tenants["alpha"].watch_streams == 2, "both streams to count")
        message = await _code(_collect(client, sid, "p_1"))
        assert message.startswith("RESOURCE_EXHAUSTED") and "max_watch_streams" in message
        tasks[1].cancel()
        await asyncio.gather(tasks[1], return_exceptions=True)
        await until(lambda: table.watching == 0, "the watch to close")
        await table.finish("p_1", 0)

        async def third() -> list[WatchItem]:
            while True:
                try:
                    return await _collect(client, sid, "p_1")
                except RequestFailed as exc:  # the slot is given back once the RPC ended
                    assert exc.code == "RESOURCE_EXHAUSTED"
                    await asyncio.sleep(0.05)

        items = await asyncio.wait_for(third(), 10)
        assert isinstance(items[-1], ProcessInfo)
        tasks[0].cancel()
        await asyncio.gather(tasks[0], return_exceptions=True)
    finally:
        for c in harness.clients:
            await c.close()
        await harness.server.stop(grace=1)


async def test_stdin_is_written_bounded_and_refused_once_closed(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1", "p_2")
    info = await client.write_process_input(sid, "p_1", "hello\n")
    assert info.stdin_open
    info = await client.write_process_input(sid, "p_1", b"", close_stdin=True)
    assert not info.stdin_open and procs.table(sid).stdin_of("p_1") == b"hello\n"
    message = await _code(client.write_process_input(sid, "p_1", b"more"))
    assert message.startswith("FAILED_PRECONDITION") and "p_1" in message
    # The stdin bound: a write past it takes nothing.
    message = await _code(client.write_process_input(sid, "p_2", b"x" * (STDIN_LIMIT + 1)))
    assert message.startswith("RESOURCE_EXHAUSTED") and str(STDIN_LIMIT) in message
    assert procs.table(sid).stdin_of("p_2") == b""
    audit = (procs.harness.tmp / "home" / "audit.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in audit if '"process.input"' in line]
    assert [(r["process"], r["bytes"], r["close_stdin"]) for r in records] == [
        ("p_1", 6, False),
        ("p_1", 0, True),
    ]


async def test_signals_reach_the_process_and_bad_ones_are_refused(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    info = await client.signal_process(sid, "p_1", "usr1")
    assert info.running and procs.table(sid).signals_of("p_1") == ["USR1"]
    info = await client.signal_process(sid, "p_1", grace_seconds=5)
    assert (info.state, info.signal) == ("killed", 15)
    again = await client.signal_process(sid, "p_1", "KILL")  # it ended: answered as it is
    assert again.state == "killed" and procs.table(sid).signals_of("p_1") == ["USR1", "TERM"]
    with pytest.raises(ValueError, match="TERM, KILL"):
        await client.signal_process(sid, "p_1", "STOP")
    # A raw request with a value the service does not know, and a grace past its bound.
    async with grpc.aio.insecure_channel(procs.harness.target) as channel:
        stub = pb_grpc.ToolDispatcherStub(channel)
        md = (("authorization", f"Bearer {TOKEN_ALPHA}"),)
        for req in (
            pb.SignalProcessRequest(session_id=sid, process_id="p_1", signal=99),  # type: ignore[arg-type]
            pb.SignalProcessRequest(session_id=sid, process_id="p_1", grace_seconds=601),
            pb.SignalProcessRequest(session_id=sid, process_id="p_1", grace_seconds=float("nan")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SignalProcess(req, metadata=md)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    audit = (procs.harness.tmp / "home" / "audit.jsonl").read_text()
    assert audit.count('"kind": "process.signal"') == 3


async def test_a_sandbox_without_a_process_table_says_so(procs: ProcHarness) -> None:
    client = procs.harness.client()
    sid = (await client.create_session("none")).session_id
    procs.provider.without.add(sid)
    procs.provider.sandboxes.pop(sid, None)
    for attempt in (
        client.list_processes(sid),
        _collect(client, sid, "p_1"),
        client.signal_process(sid, "p_1"),
    ):
        message = await _code(attempt)
        assert message.startswith("FAILED_PRECONDITION") and "process table" in message


async def test_a_watch_the_sandbox_ends_first_names_the_cursor_to_go_on_from(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    table = procs.table(sid)
    await table.emit("p_1", "stdout", b"12345")
    got: list[WatchItem] = []

    async def follow() -> None:
        async for item in client.watch_process(sid, "p_1"):
            got.append(item)

    task = asyncio.create_task(follow())
    await until(lambda: len(got) == 1, "the first chunk")
    await table.end_watches()
    with pytest.raises(RequestFailed) as err:
        await asyncio.wait_for(task, 10)
    assert err.value.code == "UNAVAILABLE" and "from cursor 5" in err.value.details


async def test_process_rpcs_resume_a_paused_session(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    await client.pause_session(sid)
    assert (await client.get_session(sid)).paused
    assert [p.process_id for p in await client.list_processes(sid)] == ["p_1"]
    assert not (await client.get_session(sid)).paused


async def test_a_server_that_drains_ends_its_process_watches(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    table = procs.table(sid)
    task = asyncio.create_task(_collect(client, sid, "p_1"))
    await until(lambda: table.watching == 1, "the watch to start")
    procs.harness.server.sessions.start_draining()
    with pytest.raises(RequestFailed) as err:
        await asyncio.wait_for(task, 10)
    assert err.value.code == "UNAVAILABLE" and "shutting down" in err.value.details
    await until(lambda: table.watching == 0, "the watch to close")


async def test_a_watch_ends_when_its_session_closes(procs: ProcHarness) -> None:
    client, sid = await _session(procs, "p_1")
    table = procs.table(sid)
    task = asyncio.create_task(_collect(client, sid, "p_1"))
    await until(lambda: table.watching == 1, "the watch to start")
    await client.close_session(sid)
    with pytest.raises(RequestFailed) as err:
        await asyncio.wait_for(task, 10)
    assert err.value.code == "NOT_FOUND" and "closed" in err.value.details
    await until(lambda: table.watching == 0, "the watch to close")


async def test_a_watch_asks_its_sandbox_for_output_only_as_it_is_sent(procs: ProcHarness) -> None:
    """A client that stops reading makes the server hold one item, not a queue: the next is asked
    of the sandbox (whose ring bounds the rest) only once the previous one went out."""
    _, sid = await _session(procs)
    table = procs.table(sid)
    table.ring_bytes = 1 << 20
    await procs.start(sid, "p_1")
    for i in range(100):
        await table.emit("p_1", "stdout", b"%05d" % i + b"." * 995)
    sessions = procs.harness.server.sessions
    tenant = procs.harness.server.tenants.get("alpha")
    items = session_processes.watch(sessions, tenant, sid, "p_1", 0)
    first = await anext(items)
    assert isinstance(first, OutputChunk) and first.data.startswith(b"00000")
    assert table.taken == 1  # nothing more was taken from the sandbox while nobody reads
    second = await anext(items)
    assert isinstance(second, OutputChunk) and second.cursor == 1000 and table.taken == 2
    await items.aclose()  # type: ignore[attr-defined]
    assert table.watching == 0
