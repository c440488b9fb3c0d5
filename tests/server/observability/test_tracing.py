"""OpenTelemetry tracing (issue 9 point 3), with the SDK's in-memory exporter: one span per Dispatch
continuing the caller's ``traceparent``, one child span per tool call; a clear exit 2 without the
``otel`` extra."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from dispatcher.server.observability.logs import JsonFormatter
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from tests.server.conftest import TOKEN_ALPHA, ServerFactory

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACING_ON = {"tracing": {"otlp_endpoint": "http://127.0.0.1:4317"}}


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Spans go to memory instead of an OTLP collector."""
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        if os.environ.get("DISPATCHER_REQUIRE_DOCKER") == "1":
            pytest.fail("the otel extra is not installed (scripts/bootstrap.sh installs it)")
        pytest.skip("the otel extra is not installed")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from dispatcher.server.observability import tracing

    memory = InMemorySpanExporter()
    monkeypatch.setattr(
        tracing.Tracing, "otlp", classmethod(lambda cls, endpoint: cls(SimpleSpanProcessor(memory)))
    )
    return memory


async def test_dispatch_and_tool_call_spans_continue_the_callers_trace(
    make_server: ServerFactory, exporter: Any
) -> None:
    # the block tool too: the tiny tenant of the base config lists it (an unknown name is an error)
    tools = [
        "tests.server.tools:make_echo_tool",
        "tests.server.tools:make_block_tool",
        "tests.server.log_tools:make_log_tool",
    ]
    harness = await make_server(**TRACING_ON, tools=tools)
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    handler.setFormatter(JsonFormatter())
    logging.getLogger("dispatcher.tests.log_tool").addHandler(handler)
    client = harness.client()
    session = await client.create_session("traced")
    async with grpc.aio.insecure_channel(harness.target) as channel:
        stub = pb_grpc.ToolDispatcherStub(channel)
        request = pb.DispatchRequest(
            session_id=session.session_id,
            turn_id="turn_1",
            tool_uses=[
                pb.ToolUse(id="tu_ok", name="echo", input_json=json.dumps({"text": "hi"})),
                pb.ToolUse(id="tu_bad", name="made up", input_json="{}"),
                pb.ToolUse(id="tu_log", name="say", input_json="{}"),
            ],
        )
        metadata = (
            ("authorization", f"Bearer {TOKEN_ALPHA}"),
            ("traceparent", f"00-{TRACE_ID}-{PARENT_SPAN}-01"),
        )
        items = [item async for item in stub.Dispatch(request, metadata=metadata)]
    logging.getLogger("dispatcher.tests.log_tool").removeHandler(handler)
    assert sum(item.HasField("result") for item in items) == 3
    (logged,) = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert logged["trace_id"] == TRACE_ID and logged["tool_use_id"] == "tu_log"
    spans = exporter.get_finished_spans()
    (dispatch,) = [s for s in spans if s.name == "Dispatch"]
    calls = sorted(
        (s for s in spans if s.name == "tool_call"), key=lambda s: s.attributes["dispatcher.tool_use_id"]
    )
    assert format(dispatch.context.trace_id, "032x") == TRACE_ID
    assert dispatch.parent is not None and format(dispatch.parent.span_id, "016x") == PARENT_SPAN
    assert dispatch.attributes["dispatcher.tenant"] == "alpha"
    assert dispatch.attributes["dispatcher.session"] == session.session_id
    assert dispatch.attributes["dispatcher.outcome"] == "ok"
    assert [(s.attributes["dispatcher.tool"], s.attributes["dispatcher.outcome"]) for s in calls] == [
        ("_unknown", "not_found"),
        ("say", "ok"),
        ("echo", "ok"),
    ]
    for span in calls:
        assert span.parent is not None and span.parent.span_id == dispatch.context.span_id
        assert span.context.trace_id == dispatch.context.trace_id
        assert span.attributes["dispatcher.tenant"] == "alpha"
        assert span.attributes["dispatcher.session"] == session.session_id


async def test_a_dispatch_without_traceparent_starts_a_trace(
    make_server: ServerFactory, exporter: Any
) -> None:
    harness = await make_server(**TRACING_ON)
    client = harness.client()
    session = await client.create_session("fresh")
    assert not (await client.call(session.session_id, "echo", {"text": "x"})).is_error
    spans = exporter.get_finished_spans()
    (dispatch,) = [s for s in spans if s.name == "Dispatch"]
    assert dispatch.parent is None
    (call,) = [s for s in spans if s.name == "tool_call"]
    assert call.parent is not None and call.parent.span_id == dispatch.context.span_id


def test_tracing_without_the_extra_is_a_config_error_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatcher.cli import main

    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name.startswith("opentelemetry") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"home": str(tmp_path / "home"), **TRACING_ON}))
    assert main(["serve", "--config", str(config), "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "tracing: needs the otel extra" in err and "pip install 'dispatcher[otel]'" in err
