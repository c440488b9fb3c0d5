"""The RPCs about a session's code contexts (``run_code``'s interpreters): ListCodeContexts and
RemoveCodeContext, on the session's process table, where the contexts live as worker processes
(``tools/code/contexts.py`` names and finds them).

Tenancy and a paused session as for the process RPCs (``processes.py``): another tenant's session
does not exist, a paused one is resumed first. A removal is audited (the caller is the approver).
"""

from __future__ import annotations

import logging

from dispatcher.core.process_api import CODE_LANGUAGES, CodeContext, CodeLanguage, ProcessError
from dispatcher.server.requests.errors import InvalidRequest
from dispatcher.server.sessions.manager import SessionManager
from dispatcher.server.sessions.processes import process_control, sandbox_errors
from dispatcher.server.tenancy.tenants import Tenant
from dispatcher.tools.code import contexts

log = logging.getLogger("dispatcher.server.sessions.code")

AUDIT_REMOVE = "code_context.remove"
"""Audit record of a client's RemoveCodeContext."""


async def list_code_contexts(sessions: SessionManager, tenant: Tenant, session_id: str) -> list[CodeContext]:
    """ListCodeContexts: the live contexts, oldest first.

    Raises:
        UnknownSessionError: no such session for this tenant.
        ProcessError: ``unsupported``, the sandbox has no process table.
        SandboxUnavailable: the sandbox failed.
    """
    state = sessions.get(tenant, session_id)
    control = await process_control(sessions, session_id)
    async with sessions.lifecycle.hold(state), sandbox_errors():
        return await contexts.list_contexts(control)


def _language(value: str) -> CodeLanguage:
    """The request's language ("": python)."""
    for language in CODE_LANGUAGES:
        if (value or "python") == language:
            return language
    raise InvalidRequest(f"language: {value!r} is not one of {', '.join(CODE_LANGUAGES)}")


async def remove_code_context(
    sessions: SessionManager, tenant: Tenant, session_id: str, language: str, name: str
) -> CodeContext:
    """RemoveCodeContext: end the context's worker (and what it started); answers once it is gone.

    Raises:
        InvalidRequest: an unknown language, a malformed name.
        ProcessError: ``no_process``: no such live context; ``unsupported``.
        UnknownSessionError, SandboxUnavailable.
    """
    state = sessions.get(tenant, session_id)
    chosen = _language(language)
    try:
        name = contexts.check_name(name or contexts.DEFAULT_CONTEXT)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    control = await process_control(sessions, session_id)
    async with sessions.lifecycle.hold(state), sandbox_errors():
        found = await contexts.find(control, chosen, name)
        if found is None:
            raise ProcessError(
                "no_process",
                f"no live {chosen} context {name!r} in this session (ListCodeContexts lists them)",
            )
        await contexts.remove(control, found)
    sessions.dispatcher.audit_record(
        AUDIT_REMOVE,
        tenant=tenant.tenant_id,
        session=session_id,
        language=chosen,
        context=name,
        process=found.process_id,
    )
    log.info(
        "code context removed",
        extra={"tenant_id": tenant.tenant_id, "session_id": session_id, "process_id": found.process_id},
    )
    return found
