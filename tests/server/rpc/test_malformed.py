"""Malformed requests get a clean answer: a status code for the request, a result for a bad tool input."""

from __future__ import annotations

import grpc
import pytest

from dispatcher.client import RequestFailed
from dispatcher.core.types import ToolResultBlock, ToolUseBlock
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc
from tests.events import ToolInputInvalid, events_of
from tests.server.conftest import TOKEN_ALPHA, Harness
from tests.server.helpers import text_of

AUTH = (("authorization", f"Bearer {TOKEN_ALPHA}"),)


async def _dispatch_status(harness: Harness, request: pb.DispatchRequest) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(harness.target) as channel:
        stub = pb_grpc.ToolDispatcherStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Dispatch(request, metadata=AUTH):
                pass
        return err.value.code()


async def test_empty_tool_uses(harness: Harness) -> None:
    session = await harness.client().create_session()
    code = await _dispatch_status(harness, pb.DispatchRequest(session_id=session.session_id))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("ids", [["a", "a"], ["a", ""], ["x", "y", "x"]])
async def test_duplicate_or_empty_ids(harness: Harness, ids: list[str]) -> None:
    session = await harness.client().create_session()
    uses = [pb.ToolUse(id=i, name="echo", input_json='{"text": "x"}') for i in ids]
    code = await _dispatch_status(harness, pb.DispatchRequest(session_id=session.session_id, tool_uses=uses))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_unknown_session(harness: Harness) -> None:
    uses = [pb.ToolUse(id="a", name="echo", input_json="{}")]
    code = await _dispatch_status(harness, pb.DispatchRequest(session_id="ses_nope", tool_uses=uses))
    assert code == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"', "null", '{"text": 1}'])
async def test_invalid_input_json_is_a_validation_result(harness: Harness, raw: str) -> None:
    client = harness.client()
    session = await client.create_session()
    items = [
        i
        async for i in client.dispatch(
            session.session_id,
            [ToolUseBlock("bad", "echo", raw), ToolUseBlock("good", "echo", {"text": "ok"})],
        )
    ]
    results = {i.tool_use_id: i for i in items if isinstance(i, ToolResultBlock)}
    assert results["bad"].is_error and str(results["bad"].error_class) == "validation_error"
    assert not results["good"].is_error and text_of(results["good"]) == "ok"
    invalid = events_of(items, ToolInputInvalid)
    assert invalid and invalid[0].tool_use_id == "bad" and invalid[0].payload.errors


async def test_an_oversized_input_is_its_calls_error_and_an_oversized_request_fails_whole(
    harness: Harness,
) -> None:
    client = harness.client()
    session = await client.create_session()
    # 5 MiB of content: over write_file's documented limit, under the request limit. The tool_use
    # fails alone, naming the limit (issue 22: limits that are what they say).
    result = await client.call(
        session.session_id, "write_file", {"path": "big.txt", "content": "x" * (5 << 20)}
    )
    assert result.is_error and str(result.error_class) == "validation_error"
    assert "4,128,768" in text_of(result) or "max_write_bytes" in text_of(result), text_of(result)
    # Past the documented request limit (server.max_request_bytes, 8 MiB) the request fails whole.
    with pytest.raises(RequestFailed) as err:
        await client.call(session.session_id, "write_file", {"path": "big.txt", "content": "x" * (9 << 20)})
    assert err.value.code == "RESOURCE_EXHAUSTED"
    assert (
        text_of(await client.call(session.session_id, "echo", {"text": "still serving"})) == "still serving"
    )


async def test_unspecified_decision_and_role(harness: Harness) -> None:
    session = await harness.client().create_session()
    async with grpc.aio.insecure_channel(harness.target) as channel:
        stub = pb_grpc.ToolDispatcherStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ResolveConfirmation(
                pb.ResolveConfirmationRequest(session_id=session.session_id, request_id="r"), metadata=AUTH
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CreateSession(pb.CreateSessionRequest(role=99), metadata=AUTH)  # type: ignore[arg-type]
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_too_many_labels(harness: Harness) -> None:
    with pytest.raises(RequestFailed) as err:
        await harness.client().create_session(labels={f"k{i}": "v" for i in range(100)})
    assert err.value.code == "INVALID_ARGUMENT"
