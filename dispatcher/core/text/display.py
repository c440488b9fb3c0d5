"""How a tool input is shown: whole and exact to a human approving it, bounded and redacted to logs.

Two audiences, two rules (design §4.2):

- A person asked to confirm a call sees exactly what will run: the whole input, never redacted or
  cut, with control and bidi characters made visible (``visible``). An input too long to show
  whole is not shown in part: the caller refuses the call rather than have it approved unseen.
- Events that only report (``tool.called``), logs and the audit log get ``summarize``: secrets
  redacted, and bounded in depth, values and characters, so that neither the time to build it nor
  the record it ends up in grows with what a tenant sends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from dispatcher.core.text.redact import REDACTED, is_secret_key, redact_text
from dispatcher.core.text.visible import count_escaped, visible

SHOW_LIMIT: Final = 256 * 1024
"""Default most characters of an input a confirmation request shows (DispatcherConfig knob)."""

SUMMARY_STRING_CHARS: Final = 2_000  # of one string in a summary
SUMMARY_KEY_CHARS: Final = 200  # of one mapping key
SUMMARY_TOTAL_CHARS: Final = 16_000  # of all strings of one summary together
SUMMARY_VALUES: Final = 1_000  # values walked
SUMMARY_DEPTH: Final = 16  # levels shown
_REDACT_MARGIN = 256  # a secret straddling a cut is still seen whole by the redactor


@dataclass(frozen=True, slots=True)
class ConfirmationText:
    """The text of a confirmation request and the facts a caller decides on."""

    text: str
    """A header line saying what follows, then the input."""
    chars: int
    """Length of the input as text (the command, or the input's JSON), before escaping."""
    escaped: int
    """How many characters of it are shown as escapes (0 when too long: not looked at)."""
    too_long: bool
    """More than the limit: ``text`` is then only the header; refuse rather than ask."""


def confirmation_text(tool_name: str, input_: Mapping[str, Any], limit: int = SHOW_LIMIT) -> ConfirmationText:
    """What to show a human who must approve this call: the whole input, exactly.

    ``shell`` shows its command as it will run (newlines kept, other keys as JSON in the header);
    other tools show their input as JSON. Escapes are used only where needed; when a shell command
    needs them, backslashes are doubled too, so an escape shown can never be mistaken for text typed.
    """
    command = input_.get("command") if tool_name == "shell" else None
    if isinstance(command, str):
        rest = {k: v for k, v in input_.items() if k != "command"}
        extra = json.dumps(rest, ensure_ascii=False, sort_keys=True) if rest else ""
        chars = len(command) + len(extra)
        what = f"shell command, {len(command):,} characters" + (f", with {visible(extra)}" if extra else "")
        text, keep_newlines, how = command, True, "backslashes doubled"
    else:
        text = json.dumps(input_, ensure_ascii=False, sort_keys=True)
        extra, chars = "", len(text)
        what, keep_newlines, how = f"input as JSON, {chars:,} characters", False, "JSON escapes"
    if chars > limit:  # checked before escaping: the cost of a refusal does not grow with the input
        header = f"{what}: {chars:,} in all, too long to show (at most {limit:,}), not shown"
        return ConfirmationText(header, chars, 0, too_long=True)
    escaped = count_escaped(text, keep_newlines=keep_newlines) + count_escaped(extra)
    # JSON already escapes backslashes; a command's are doubled once anything in it is escaped.
    body = visible(text, keep_newlines=keep_newlines, escape_backslash=keep_newlines and escaped > 0)
    if escaped:
        header = (
            f"{what}; {escaped:,} shown escaped (control or bidi characters as \\r, \\x1b, \\u202e; {how}):"
        )
    else:
        header = f"{what}, shown exactly:"
    return ConfirmationText(f"{header}\n{body}", chars, escaped, too_long=False)


class _Budget:
    """What is left of one summary's allowance; shared by the whole walk."""

    def __init__(self) -> None:
        self.values = SUMMARY_VALUES
        self.chars = SUMMARY_TOTAL_CHARS


def summarize(value: Any) -> Any:
    """A bounded, redacted copy of ``value`` for events, logs and audit (never for approval)."""
    return _summarize(value, _Budget(), 0)


def _summarize(value: Any, budget: _Budget, depth: int) -> Any:
    budget.values -= 1
    if isinstance(value, str):
        return _summarize_text(value, min(SUMMARY_STRING_CHARS, max(budget.chars, 0)), budget)
    if isinstance(value, Mapping | list | tuple) and depth >= SUMMARY_DEPTH:
        return f"[nested deeper than {SUMMARY_DEPTH} levels: not shown]"
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for i, (key, item) in enumerate(value.items()):
            if budget.values <= 0:
                out["..."] = f"[{len(value) - i:,} more keys]"
                break
            name = _summarize_text(str(key), SUMMARY_KEY_CHARS, budget)
            secret = isinstance(item, str) and item and is_secret_key(str(key))
            out[name] = REDACTED if secret else _summarize(item, budget, depth + 1)
        return out
    if isinstance(value, list | tuple):
        items: list[Any] = []
        for i, item in enumerate(value):
            if budget.values <= 0:
                items.append(f"[{len(value) - i:,} more items]")
                break
            items.append(_summarize(item, budget, depth + 1))
        return items
    if value is None or isinstance(value, bool | int | float):
        return value
    return _summarize_text(str(value), SUMMARY_KEY_CHARS, budget)


def _summarize_text(text: str, keep: int, budget: _Budget) -> str:
    """``text`` redacted and cut to ``keep`` characters (the cut says how much)."""
    if len(text) <= keep:
        budget.chars -= len(text)
        return redact_text(text)
    # Redact a little more than is kept, so that a secret across the cut is recognised whole.
    shown = redact_text(text[: keep + _REDACT_MARGIN])[:keep]
    budget.chars -= keep
    return f"{shown}... [{len(text) - keep:,} more characters]"
