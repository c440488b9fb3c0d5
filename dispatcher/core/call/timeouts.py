"""How long one call may run (spec 000 §4 step 7): per tool, else by side-effect class.

The order, first that applies: the ``timeouts:`` map of the config (tool name -> seconds), the
tool's own ``timeout_seconds``, then ``dispatcher.default_timeout`` (60 s) or, for EXECUTE and
NETWORK tools, ``dispatcher.execute_timeout`` (600 s). A tool that stops itself (``shell``: SIGTERM,
grace, SIGKILL, then its partial output) takes a ``timeout_seconds`` input that can only shorten
that limit, and the dispatcher waits its ``kill_slack_seconds`` more before abandoning it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dispatcher.core.call.settings import DispatcherConfig
from dispatcher.core.errors import ConfigError
from dispatcher.core.types import SideEffect, ToolDefinition

__all__ = ["MAX_TIMEOUT_SECONDS", "call_timeout", "check_timeout_names"]

MAX_TIMEOUT_SECONDS = 24 * 3600.0
"""The longest limit the ``timeouts:`` map may give a tool."""


def check_timeout_names(timeouts: Mapping[str, float], names: Iterable[str]) -> None:
    """Every ``timeouts:`` entry names a registered tool (checked once the registry is complete).

    Raises:
        ConfigError: naming the first entry that matches no tool.
    """
    known = set(names)
    for name in sorted(timeouts):
        if name not in known:
            raise ConfigError(f"timeouts.{name}: no tool named {name!r} is registered")


def call_timeout(
    definition: ToolDefinition, input_: Mapping[str, Any], config: DispatcherConfig
) -> tuple[float, float]:
    """``(limit, wait)``: the limit the call runs under (a self-stopping tool enforces it itself)
    and how long the dispatcher waits before it cancels, then abandons, the call."""
    limit = config.timeouts.get(definition.name) or definition.timeout_seconds
    if limit is None:
        limit = (
            config.execute_timeout
            if definition.side_effect in (SideEffect.EXECUTE, SideEffect.NETWORK)
            else config.default_timeout
        )
    if definition.kill_slack_seconds <= 0:
        return limit, limit
    asked = input_.get("timeout_seconds")
    if isinstance(asked, int | float) and not isinstance(asked, bool) and 0 < asked < limit:
        limit = float(asked)  # the model may shorten its limit, never lengthen it
    return limit, limit + definition.kill_slack_seconds
