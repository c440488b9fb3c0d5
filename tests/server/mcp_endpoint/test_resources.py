"""A plan-mode session's plan and a review session's staged writes as MCP resources; no prompts; an
image a tool returns stays an image."""

from __future__ import annotations

import base64
import json
from typing import Any

import mcp_types as mt
import pytest
from mcp.shared.exceptions import MCPError

from tests.mcp_host import http_session, text_of
from tests.server.conftest import TOKEN_ALPHA, TOKEN_BETA, ServerFactory


async def _url(make_server: ServerFactory) -> str:
    harness = await make_server(mcp_endpoint={"listen": "127.0.0.1:0"})
    assert harness.server.mcp_endpoint is not None
    return f"http://127.0.0.1:{harness.server.mcp_endpoint.port}/mcp"


def _json(result: mt.ReadResourceResult) -> dict[str, Any]:
    (content,) = result.contents
    assert isinstance(content, mt.TextResourceContents) and content.mime_type == "application/json"
    body: dict[str, Any] = json.loads(content.text)
    return body


async def test_the_plan_and_the_staged_changes_are_resources(make_server: ServerFactory) -> None:
    url = await _url(make_server)
    async with http_session(url, TOKEN_ALPHA, mode="plan") as planning:
        (plan_uri, _) = sorted(str(r.uri) for r in (await planning.list_resources()).resources)
        held = await planning.call_tool("write_file", {"path": "p.txt", "content": "later"})
        assert held.is_error  # held back as a step, not run
        plan = _json(await planning.read_resource(plan_uri))
        assert plan["approval_mode"] == "plan"
        (step,) = plan["steps"]
        assert step["tool_name"] == "write_file" and step["step"] == 1
        assert (await planning.list_prompts()).prompts == []

    async with http_session(url, TOKEN_ALPHA, mode="review") as reviewing:
        staged_uri = next(
            str(r.uri) for r in (await reviewing.list_resources()).resources if "staged" in str(r.uri)
        )
        done = await reviewing.call_tool("write_file", {"path": "r.txt", "content": "new\n"})
        assert not done.is_error
        staged = _json(await reviewing.read_resource(staged_uri))
        (change,) = staged["changes"]
        assert change["path"].endswith("r.txt") and "+new" in change["diff"]

        templates = (await reviewing.list_resource_templates()).resource_templates
        assert {t.uri_template for t in templates} == {
            "dispatcher://sessions/{id}/plan",
            "dispatcher://sessions/{id}/staged",
        }
        with pytest.raises(MCPError, match="expected dispatcher://sessions/SESSION_ID/plan"):
            await reviewing.read_resource("dispatcher://elsewhere")

    # Another tenant's session is not found, whatever its id.
    sid = staged_uri.split("/")[3]
    async with http_session(url, TOKEN_BETA) as beta:
        with pytest.raises(MCPError, match="NOT_FOUND"):
            await beta.read_resource(f"dispatcher://sessions/{sid}/plan")


async def test_an_image_read_is_an_image_content(make_server: ServerFactory) -> None:
    url = await _url(make_server)
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(64))
    async with http_session(url, TOKEN_ALPHA, workspace="pics") as mcp:
        wrote = await mcp.call_tool("shell", {"command": f"printf '{_octal(png)}' > pic.png"})
        assert not wrote.is_error, text_of(wrote)
        read = await mcp.call_tool("read_file", {"path": "pic.png"})
    assert not read.is_error
    (image,) = [c for c in read.content if isinstance(c, mt.ImageContent)]
    assert image.mime_type == "image/png" and base64.b64decode(image.data) == png


def _octal(data: bytes) -> str:
    return "".join(f"\\{b:03o}" for b in data)
