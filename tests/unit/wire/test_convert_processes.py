"""Proto <-> domain for background processes: the record both ways, signals by name, and a
watch's items as stream messages (a loss before its chunk, a loss alone, the end)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dispatcher.cli.output import describe
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import ProcessExited, ProcessStarted
from dispatcher.core.process_api import OutputChunk, ProcessInfo
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.wire import convert_processes as cp

RUNNING = ProcessInfo(
    process_id="p_1",
    command="python3 app.py",
    cwd="sub",
    pid=42,
    state="running",
    exit_code=None,
    signal=None,
    started=1_700_000_000.5,
    ended=None,
    tool_use_id="tu_1",
    end=300,
    first=44,
    ring_bytes=256,
    stdin_open=True,
    origin="background",
)


def test_a_record_round_trips_running_and_ended() -> None:
    assert cp.process_from_pb(cp.process_to_pb(RUNNING)) == RUNNING
    msg = cp.process_to_pb(RUNNING)
    assert not msg.HasField("exit_code") and not msg.HasField("end_time")
    assert msg.state == pb.PROCESS_STATE_RUNNING and msg.output_end == 300 and msg.output_first == 44
    killed = replace(RUNNING, state="killed", signal=15, ended=1_700_000_009.5)
    left = replace(RUNNING, state="exited", ended=1_700_000_001.0, origin="left", tool_use_id=None)
    for info in (killed, left):
        assert cp.process_from_pb(cp.process_to_pb(info)) == info
    # A group left by a foreground command ends with neither an exit code nor a signal.
    assert not cp.process_to_pb(left).HasField("exit_code") and not cp.process_to_pb(left).HasField("signal")


def test_signals_by_name_and_unknown_values() -> None:
    assert cp.signal_to_pb("term") == pb.PROCESS_SIGNAL_TERM
    assert cp.signal_to_pb("SIGUSR2") == pb.PROCESS_SIGNAL_USR2
    with pytest.raises(ValueError, match="expected one of TERM, KILL, INT, HUP, QUIT, USR1, USR2"):
        cp.signal_to_pb("STOP")
    assert cp.signal_from_pb(pb.PROCESS_SIGNAL_UNSPECIFIED) == "TERM"
    assert cp.signal_from_pb(pb.PROCESS_SIGNAL_KILL) == "KILL"
    assert cp.signal_from_pb(99) is None


def test_watch_items_carry_a_loss_before_their_chunk() -> None:
    lost_then_data = cp.watch_items_to_pb(OutputChunk("stderr", 100, b"abc", lost=60))
    assert [m.WhichOneof("item") for m in lost_then_data] == ["truncated", "output"]
    assert cp.watch_item_from_pb(lost_then_data[0]) == cp.ProcessTruncated(lost=60, cursor=100)
    assert cp.watch_item_from_pb(lost_then_data[1]) == OutputChunk("stderr", 100, b"abc")
    only_lost = cp.watch_items_to_pb(OutputChunk("stdout", 10, b"", lost=10))
    assert [m.WhichOneof("item") for m in only_lost] == ["truncated"]
    end = cp.watch_items_to_pb(RUNNING)
    assert [m.WhichOneof("item") for m in end] == ["exited"] and cp.watch_item_from_pb(end[0]) == RUNNING
    assert cp.watch_item_from_pb(pb.WatchProcessResponse()) is None  # a kind this client does not know


def test_the_cli_describes_process_events() -> None:
    started = Event(3, 0.0, "s", "", "tu_1", ProcessStarted("p_1", "python3\x1b[2J app.py", 42, "left"))
    assert describe(started, "") == (
        "process p_1 left running by a foreground command (pid 42): python3\\x1b[2J app.py"
    )
    exited = Event(4, 0.0, "s", "", "tu_1", ProcessExited("p_1", "killed", signal=15, output_bytes=12345))
    assert describe(exited, "") == "process p_1 killed (signal 15), 12,345 bytes of output"
