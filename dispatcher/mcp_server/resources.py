"""What a host may show beside the tools: a plan-mode session's plan, a review/audit session's
staged changes, as MCP resources ``dispatcher://sessions/{id}/plan`` and ``.../staged`` (JSON).

Any session the caller's token may see can be read, not only the bridge's own: the server decides
(``NOT_FOUND`` for another tenant's), as it does for ``GetSession`` and ``ListStagedChanges``.
"""

from __future__ import annotations

import dataclasses
import json
import re

import mcp_types as mt
from mcp.shared.exceptions import MCPError

from dispatcher.client.aio import AsyncDispatcherClient

SCHEME = "dispatcher"
_URI = re.compile(r"^dispatcher://sessions/(?P<sid>[^/]+)/(?P<what>plan|staged)$")
TEMPLATES = [
    mt.ResourceTemplate(
        name="plan",
        uri_template="dispatcher://sessions/{id}/plan",
        description="the steps a plan-mode session proposed, awaiting approval (dispatcher plan)",
        mime_type="application/json",
    ),
    mt.ResourceTemplate(
        name="staged",
        uri_template="dispatcher://sessions/{id}/staged",
        description="a review or audit session's staged writes with their diffs (dispatcher staged)",
        mime_type="application/json",
    ),
]


def listed(session_id: str) -> list[mt.Resource]:
    """The bridge's own session's two resources."""
    return [
        mt.Resource(
            name=t.name,
            uri=t.uri_template.replace("{id}", session_id),
            description=t.description,
            mime_type=t.mime_type,
        )
        for t in TEMPLATES
    ]


async def read(client: AsyncDispatcherClient, uri: str) -> mt.ReadResourceResult:
    """The resource's JSON.

    Raises:
        MCPError: not one of our URIs (INVALID_PARAMS); RequestFailed from the server otherwise.
    """
    match = _URI.match(uri)
    if match is None:
        raise MCPError(
            mt.INVALID_PARAMS,
            f"unknown resource {uri!r}: expected dispatcher://sessions/SESSION_ID/plan or .../staged",
        )
    sid = match["sid"]
    if match["what"] == "plan":
        info = await client.get_session(sid)
        body: object = {
            "session_id": sid,
            "approval_mode": info.approval_mode,
            "steps": [dataclasses.asdict(step) for step in info.plan],
        }
    else:
        changes = await client.list_staged(sid)
        body = {"session_id": sid, "changes": [dataclasses.asdict(ch) for ch in changes]}
    text = json.dumps(body, ensure_ascii=False, indent=1, default=str)
    return mt.ReadResourceResult(
        contents=[mt.TextResourceContents(uri=uri, mime_type="application/json", text=text)]
    )
