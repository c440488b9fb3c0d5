"""The sync Python client against grpcio-testing's fake channel: requests, metadata, conversions, errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import grpc_testing
import pytest

from dispatcher.client import DispatcherClient, RequestFailed
from dispatcher.core.dispatcher import Decision
from dispatcher.core.events.bus import Event
from dispatcher.core.events.payloads import to_dict
from dispatcher.core.types import ImageBlock, Role, SideEffect, TextBlock, ToolResultBlock, ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["ToolDispatcher"]
T = TypeVar("T")


@pytest.fixture
def fake() -> Iterator[tuple[Any, DispatcherClient, ThreadPoolExecutor]]:
    channel = grpc_testing.channel([SERVICE], grpc_testing.strict_real_time())
    client = DispatcherClient(channel=channel, token="tok-123")
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield channel, client, pool


def _unary(
    fake: Any, name: str, call: Callable[[], T], response: Any, code: grpc.StatusCode = grpc.StatusCode.OK
) -> tuple[Any, Any, Future[T]]:
    channel, _, pool = fake
    future = pool.submit(call)
    metadata, request, rpc = channel.take_unary_unary(SERVICE.methods_by_name[name])
    rpc.terminate(response, (), code, "nope" if code != grpc.StatusCode.OK else "")
    return metadata, request, future


def test_create_session_sends_token_and_converts(fake: Any) -> None:
    _, client, _ = fake
    session = pb.Session(
        session_id="ses_1",
        workspace="w",
        workspace_path="/x/w",
        role=pb.ROLE_WORKER,
        labels={"a": "b"},
        last_event_seq=7,
    )
    metadata, request, future = _unary(
        fake,
        "CreateSession",
        lambda: client.create_session("w", role=Role.WORKER, labels={"a": "b"}),
        pb.CreateSessionResponse(session=session),
    )
    assert ("authorization", "Bearer tok-123") in metadata
    assert (request.workspace, request.role, dict(request.labels)) == ("w", pb.ROLE_WORKER, {"a": "b"})
    info = future.result(5)
    assert (info.session_id, info.role, info.last_event_seq, dict(info.labels)) == (
        "ses_1",
        Role.WORKER,
        7,
        {"a": "b"},
    )


def test_list_tools_parses_schema(fake: Any) -> None:
    _, client, _ = fake
    tool = pb.Tool(
        name="read_file",
        description="d",
        input_schema_json='{"type": "object"}',
        side_effect=pb.SIDE_EFFECT_READ,
    )
    _, request, future = _unary(
        fake, "ListTools", lambda: client.list_tools("ses_1"), pb.ListToolsResponse(tools=[tool])
    )
    assert request.session_id == "ses_1"
    [info] = future.result(5)
    assert (info.name, info.side_effect, dict(info.input_schema)) == (
        "read_file",
        SideEffect.READ,
        {"type": "object"},
    )


def test_other_unary_methods(fake: Any) -> None:
    _, client, _ = fake
    _, req, fut = _unary(
        fake,
        "ListSessions",
        client.list_sessions,
        pb.ListSessionsResponse(sessions=[pb.Session(session_id="s")]),
    )
    assert [s.session_id for s in fut.result(5)] == ["s"]
    _, req, fut = _unary(
        fake,
        "GetSession",
        lambda: client.get_session("s"),
        pb.GetSessionResponse(session=pb.Session(session_id="s")),
    )
    assert req.session_id == "s" and fut.result(5).session_id == "s"
    _, req, fut = _unary(fake, "CloseSession", lambda: client.close_session("s"), pb.CloseSessionResponse())
    assert req.session_id == "s" and fut.result(5) is None
    _, req, fut = _unary(
        fake, "CancelSessionTools", lambda: client.cancel("s"), pb.CancelSessionToolsResponse()
    )
    assert req.session_id == "s" and fut.result(5) is None


def test_resolve_confirmation(fake: Any) -> None:
    _, client, _ = fake
    _, request, future = _unary(
        fake,
        "ResolveConfirmation",
        lambda: client.resolve_confirmation("s", "r1", Decision.DENY, remember=True),
        pb.ResolveConfirmationResponse(applied=False, decision=pb.DECISION_ALLOW),
    )
    assert (request.request_id, request.decision, request.remember) == ("r1", pb.DECISION_DENY, True)
    assert future.result(5) == (False, Decision.ALLOW)


def test_status_codes_become_request_failed(fake: Any) -> None:
    _, client, _ = fake
    _, _, future = _unary(
        fake,
        "GetSession",
        lambda: client.get_session("x"),
        pb.GetSessionResponse(),
        grpc.StatusCode.NOT_FOUND,
    )
    with pytest.raises(RequestFailed) as err:
        future.result(5)
    assert (err.value.code, err.value.details) == ("NOT_FOUND", "nope")


def _event(seq: int, kind: str, **payload: Any) -> pb.DispatchResponse:
    event = pb.Event(seq=seq, session_id="s", turn_id="t", tool_use_id="tu", type=kind)
    getattr(event, kind.removeprefix("tool.")).CopyFrom(payload.pop("msg"))
    return pb.DispatchResponse(event=event)


def test_dispatch_and_call_stream_events_and_result(fake: Any) -> None:
    channel, client, pool = fake
    seen: list[Event] = []
    future = pool.submit(
        lambda: client.call(
            "s", "shell", {"command": "ls", "n": 2**60}, tool_use_id="tu", turn_id="t", on_event=seen.append
        )
    )
    metadata, request, rpc = channel.take_unary_stream(SERVICE.methods_by_name["Dispatch"])
    assert ("authorization", "Bearer tok-123") in metadata
    [use] = request.tool_uses
    assert (use.id, use.name, json.loads(use.input_json)) == ("tu", "shell", {"command": "ls", "n": 2**60})
    rpc.send_response(
        _event(
            1,
            "tool.called",
            msg=pb.ToolCalled(
                tool_name="shell", side_effect=pb.SIDE_EFFECT_EXECUTE, input_json='{"command": "ls"}'
            ),
        )
    )
    rpc.send_response(
        _event(2, "tool.output_delta", msg=pb.ToolOutputDelta(stream=pb.OUTPUT_STREAM_STDERR, text="hi"))
    )
    result = pb.ToolResult(
        tool_use_id="tu",
        is_error=True,
        error_class=pb.ERROR_CLASS_EXECUTION_ERROR,
        content=[
            pb.ContentBlock(text=pb.TextContent(text="hi")),
            pb.ContentBlock(image=pb.ImageContent(data=b"\x89PNG", media_type="image/png")),
        ],
        metadata_json='{"exit_code": 1}',
        command_executed="ls",
    )
    rpc.send_response(pb.DispatchResponse(result=result))
    rpc.terminate((), grpc.StatusCode.OK, "")
    block = future.result(5)
    assert isinstance(block, ToolResultBlock)
    assert block.is_error and str(block.error_class) == "execution_error"
    assert block.content == (TextBlock("hi"), ImageBlock(b"\x89PNG", "image/png"))
    assert (
        block.metadata == {"exit_code": 1} and block.command_executed == "ls" and block.files_modified == ()
    )
    assert [(e.seq, e.type) for e in seen] == [(1, "tool.called"), (2, "tool.output_delta")]
    assert to_dict(seen[0].payload) == {
        "tool_name": "shell",
        "side_effect": SideEffect.EXECUTE,
        "input": {"command": "ls"},
    }
    assert to_dict(seen[1].payload) == {"stream": "stderr", "text": "hi"}


def test_dispatch_raw_json_and_generated_ids(fake: Any) -> None:
    channel, client, pool = fake
    future = pool.submit(
        lambda: list(client.dispatch("s", [ToolUseBlock("a", "echo", "{bad"), ("echo", {"text": "x"})]))
    )
    _, request, rpc = channel.take_unary_stream(SERVICE.methods_by_name["Dispatch"])
    assert request.tool_uses[0].input_json == "{bad"  # a raw string goes as is
    assert request.tool_uses[1].id.startswith("tu_")
    rpc.terminate((), grpc.StatusCode.INVALID_ARGUMENT, "bad")
    with pytest.raises(RequestFailed) as err:
        future.result(5)
    assert err.value.code == "INVALID_ARGUMENT"


def test_watch(fake: Any) -> None:
    channel, client, pool = fake
    future = pool.submit(lambda: list(client.watch("s", after_seq=5)))
    _, request, rpc = channel.take_unary_stream(SERVICE.methods_by_name["WatchSession"])
    assert (request.session_id, request.after_seq) == ("s", 5)
    resolved = pb.Event(
        seq=6,
        type="tool.confirmation_resolved",
        confirmation_resolved=pb.ToolConfirmationResolved(
            request_id="r", decision=pb.DECISION_DENY, reason=pb.RESOLUTION_REASON_TIMEOUT
        ),
    )
    rpc.send_response(pb.WatchSessionResponse(event=resolved))
    rpc.terminate((), grpc.StatusCode.OK, "")
    [event] = future.result(5)
    assert to_dict(event.payload) == {"request_id": "r", "decision": Decision.DENY, "reason": "timeout"}
