"""Asking a human about an unlisted host (``unknown: prompt``), and what a session remembers.

The proxy calls an ``Ask`` the server wires to its confirmation stream (a
``tool.confirmation_requested`` with ``side_effect: SIDE_EFFECT_NETWORK``, ``tool_name: "egress"``,
``input_summary: "connect HOST:PORT"``); the approval mode's say (autonomous allows, manual and
cautious ask) belongs to that callback. Neither the callback nor a human can override the port list,
``deny_networks`` or the server's own ports: those are checked before anyone is asked (ports,
IP literals) or after the answer, before connecting (resolved addresses). A session narrowed by its
``egress_allow`` is never asked: its policy's ``unknown`` is deny (``policy.session_policy``).

``pip`` opens several connections to the same host at once; they share one question. An answer with
``remember`` holds for the rest of the session: an allow lets the host through without asking, a
deny refuses it without asking again (a retrying tool would otherwise flood the human).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Ask", "PromptAnswer", "PromptBook", "PromptVerdict"]

log = logging.getLogger("dispatcher.egress")


class PromptVerdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    TIMEOUT = "timeout"
    """Nobody answered within ``dispatcher.confirmation_timeout``: refused."""


@dataclass(frozen=True, slots=True)
class PromptAnswer:
    verdict: PromptVerdict
    remember: bool = False


Ask = Callable[[str, int, str | None], Awaitable[PromptAnswer]]
"""``ask(host, port, tool_use_id)``: publish the confirmation request (on ``tool_use_id``, the call
whose process opened the connection; None: the session alone) and wait for its answer."""


class PromptBook:
    """One session's questions in flight and remembered answers, by host."""

    def __init__(self) -> None:
        self.allowed: set[str] = set()
        self.denied: set[str] = set()
        self._pending: dict[str, asyncio.Future[PromptAnswer]] = {}

    async def ask(self, ask: Ask, host: str, port: int, tool_use_id: str | None) -> PromptAnswer:
        """The answer for ``host``: remembered, shared with a question already in flight, or asked.

        A remembered answer comes back with ``remember`` set.
        """
        if host in self.allowed:
            return PromptAnswer(PromptVerdict.ALLOW, remember=True)
        if host in self.denied:
            return PromptAnswer(PromptVerdict.DENY, remember=True)
        pending = self._pending.get(host)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[PromptAnswer] = asyncio.get_running_loop().create_future()
        self._pending[host] = future
        try:
            answer = await ask(host, port, tool_use_id)
        except BaseException as exc:
            # Those waiting on this question are refused with it; nothing is remembered.
            future.set_result(PromptAnswer(PromptVerdict.TIMEOUT))
            if isinstance(exc, Exception):
                log.warning("egress prompt failed; refused: %r", exc, extra={"host": host})
                return PromptAnswer(PromptVerdict.TIMEOUT)
            raise
        finally:
            self._pending.pop(host, None)
        if answer.remember and answer.verdict is not PromptVerdict.TIMEOUT:
            (self.allowed if answer.verdict is PromptVerdict.ALLOW else self.denied).add(host)
        future.set_result(answer)
        return answer
