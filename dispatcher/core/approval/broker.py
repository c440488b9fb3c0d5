"""Confirmation broker of one session: pending requests, first-answer-wins, remembered approvals."""

from __future__ import annotations

import asyncio
import secrets
from collections import OrderedDict
from enum import StrEnum

from dispatcher.core.errors import UnknownConfirmationError


class Decision(StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class ConfirmationBroker:
    """Tracks the questions a session's calls are waiting on and the answers given."""

    def __init__(self, *, keep_resolved: int = 1024) -> None:
        self._pending: dict[str, asyncio.Future[tuple[Decision, bool]]] = {}
        # Answered requests are kept (bounded) so that a late second client learns who won.
        self._resolved: OrderedDict[str, Decision] = OrderedDict()
        self._keep_resolved = keep_resolved
        self._remembered: dict[str, Decision] = {}
        self._unrememberable: set[str] = set()  # pending requests whose answer is never remembered

    def open(self, *, rememberable: bool = True) -> tuple[str, asyncio.Future[tuple[Decision, bool]]]:
        """A new request id and the future its answer (decision, remember) will land in;
        ``rememberable`` False: an answer's ``remember`` is ignored (an always-prompt tool)."""
        request_id = "cr_" + secrets.token_hex(8)
        future: asyncio.Future[tuple[Decision, bool]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if not rememberable:
            self._unrememberable.add(request_id)
        return request_id, future

    def rememberable(self, request_id: str) -> bool:
        """Whether an answer to this request can be remembered (False for unknown requests)."""
        return request_id in self._pending and request_id not in self._unrememberable

    def resolve(
        self, request_id: str, decision: Decision, *, remember: bool = False
    ) -> tuple[bool, Decision]:
        """Answer a request. Returns (applied, winning decision); only the first answer applies.

        Raises:
            UnknownConfirmationError: no such request in this session.
        """
        future = self._pending.pop(request_id, None)
        if future is None or future.done():
            if request_id in self._resolved:
                return False, self._resolved[request_id]
            raise UnknownConfirmationError(f"no confirmation request {request_id!r}")
        future.set_result((decision, remember))
        self._unrememberable.discard(request_id)
        self._record(request_id, decision)
        return True, decision

    def expire(self, request_id: str, decision: Decision = Decision.DENY) -> None:
        """Close a request nobody answered (timeout, cancel) so later answers lose to ``decision``."""
        future = self._pending.pop(request_id, None)
        if future is not None and not future.done():
            future.cancel()
        self._unrememberable.discard(request_id)
        self._record(request_id, decision)

    def remember(self, tool_name: str, decision: Decision) -> None:
        self._remembered[tool_name] = decision

    def remembered(self, tool_name: str) -> Decision | None:
        return self._remembered.get(tool_name)

    def remembered_answers(self) -> dict[str, Decision]:
        """Every remembered answer, tool name -> decision (persisted with the session)."""
        return dict(self._remembered)

    def restore_remembered(self, answers: dict[str, Decision]) -> None:
        """Put back the answers a previous life of the session remembered."""
        self._remembered.update(answers)

    def pending_ids(self) -> list[str]:
        return list(self._pending)

    def _record(self, request_id: str, decision: Decision) -> None:
        self._resolved[request_id] = decision
        while len(self._resolved) > self._keep_resolved:
            self._resolved.popitem(last=False)
