"""ListCodeContexts and RemoveCodeContext through a real gRPC server, over a session's process
table (``memory_table.py``) holding workers as ``run_code`` names them: tenancy, the listing,
a removal and its audit, bad requests. (The workers themselves: tests/integration's run_code.)"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.client import RequestFailed
from tests.server.conftest import TOKEN_BETA
from tests.server.processes.conftest import ProcHarness


async def _code(aw: Any) -> str:
    with pytest.raises(RequestFailed) as err:
        await aw
    return err.value.code + ": " + err.value.details


async def test_contexts_are_listed_removed_and_audited(procs: ProcHarness) -> None:
    client = procs.harness.client()
    sid = (await client.create_session("code")).session_id
    for pid in ("code:python:default:1", "code:python:default:2", "code:javascript:web:1", "p_1"):
        await procs.start(sid, pid)
    await procs.table(sid).finish("code:python:default:1", 0)  # an earlier generation, ended
    listed = await client.list_code_contexts(sid)
    assert [(c.language, c.name, c.generation, c.process_id) for c in listed] == [
        ("python", "default", 2, "code:python:default:2"),
        ("javascript", "web", 1, "code:javascript:web:1"),
    ]
    assert listed[0].info.running and listed[0].info.tool_use_id == "tu_code:python:default:2"
    removed = await client.remove_code_context(sid, "web", language="javascript")
    assert removed.process_id == "code:javascript:web:1"
    assert procs.table(sid).signals_of("code:javascript:web:1") == ["KILL"]
    assert [c.name for c in await client.list_code_contexts(sid)] == ["default"]
    assert (await _code(client.remove_code_context(sid, "web", language="javascript"))).startswith(
        "NOT_FOUND: no live javascript context 'web'"
    )
    removed = await client.remove_code_context(sid)  # python, default
    assert removed.generation == 2 and await client.list_code_contexts(sid) == []
    audit = (procs.harness.tmp / "home" / "audit.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in audit if '"code_context.remove"' in line]
    assert [(r["language"], r["context"], r["process"]) for r in records] == [
        ("javascript", "web", "code:javascript:web:1"),
        ("python", "default", "code:python:default:2"),
    ]


async def test_another_tenant_finds_no_session_and_bad_requests_say_why(procs: ProcHarness) -> None:
    client = procs.harness.client()
    sid = (await client.create_session("code")).session_id
    await procs.start(sid, "code:python:default:1")
    beta = procs.harness.client(TOKEN_BETA)
    for attempt in (beta.list_code_contexts(sid), beta.remove_code_context(sid)):
        assert (await _code(attempt)).startswith("NOT_FOUND: no session")
    assert procs.table(sid).signals_of("code:python:default:1") == []
    assert (await _code(client.remove_code_context(sid, language="ruby"))).startswith(
        "INVALID_ARGUMENT: language: 'ruby' is not one of python, javascript"
    )
    assert (await _code(client.remove_code_context(sid, "no/such"))).startswith(
        "INVALID_ARGUMENT: context: 'no/such' is not a context name"
    )
