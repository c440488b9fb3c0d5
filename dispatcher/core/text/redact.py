"""Secret redaction of tool arguments before they reach events, logs and the audit log (spec 004).

Every pattern here runs in time linear in the text: a tenant controls every byte of a tool input,
and redaction runs on the event loop. Rules that keep it so: no two adjacent or nested unbounded
quantifiers that can match the same characters (possessive ``*+``/``++`` where they could), and
where a pattern needs "a run that somewhere contains a word" the run is matched once, possessively,
and the word is looked for in it afterwards. On top of that ``redact_text`` scans at most
``SCAN_BUDGET`` characters of one string: the head and the tail; the middle of a longer string is
replaced by a marker, never passed on unscanned.

Redaction is for logs and audit. What a human is asked to approve is never redacted (see
``dispatcher.core.text.display``).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[REDACTED]"
SCAN_BUDGET = 64 * 1024
"""Characters of one string that are scanned; longer strings keep their head and tail only."""

# A key is secret-named when one of its _/-/. separated parts says so ("db_password", "apiKey").
_SECRET_KEY = re.compile(
    r"(?i)(?:^|[_.-])(?:pass(?:word|wd|phrase)?|secret|token|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|authorization|credentials?|cookie)s?(?:$|[_.-])|[a-z](?:Password|Secret|Token|ApiKey)$"
)

# key=value / key: value pairs in free text (commands, env dumps, URLs' query strings). The key is
# a whole run of key characters (the lookbehind lets it start only where a run starts, and ``++``
# never gives characters back), so each character is looked at a bounded number of times; whether
# the key names a secret is decided afterwards, on the run alone.
_KEY_AND_SEPARATOR = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]++)\s*+[=:]\s*+")
_SECRET_WORD = re.compile(r"(?i)pass(?:word|wd)?|secret|token|api[_-]?key|access[_-]?key")
_BARE_VALUE = re.compile(r"[^\s&;'\"]++")

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(bearer|basic)\s++[A-Za-z0-9._~+/=-]{8,}+"), r"\1 " + REDACTED),
    # A private key block; one whose END line is missing (cut, or never there) is redacted to the end.
    (
        re.compile(
            r"-----BEGIN [A-Z ]{0,64}PRIVATE KEY-----(?:.*?-----END [A-Z ]{0,64}PRIVATE KEY-----|.*+)", re.S
        ),
        REDACTED,
    ),
    (re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}+"), REDACTED),  # OpenAI/Anthropic/Stripe-style keys
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}+"), REDACTED),  # GitHub tokens
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}+"), REDACTED),  # Slack tokens
    (re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), REDACTED),  # AWS access key ids
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+"), REDACTED),  # JWTs
    (re.compile(r"(://[^/\s:@]++:)[^@\s/]++@"), r"\1" + REDACTED + "@"),  # user:pass@ in URLs
)


def is_secret_key(key: str) -> bool:
    """True when a mapping key names a secret ("db_password", "apiKey", "Authorization")."""
    return _SECRET_KEY.search(key) is not None


def _redact_pairs(text: str) -> str:
    """Replace the value of every ``key=value`` / ``key: value`` whose key names a secret."""
    out: list[str] = []
    done = 0  # text[:done] is already in ``out``
    quote_end: dict[str, int] = {}  # next closing quote at or after a position, per quote character
    for match in _KEY_AND_SEPARATOR.finditer(text):
        if match.start() < done or not _SECRET_WORD.search(match.group(1)):
            continue  # inside a value already replaced, or not a secret
        start = match.end()
        end = _value_end(text, start, quote_end)
        if end is None:
            continue
        out += (text[done:start], REDACTED)
        done = end
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _value_end(text: str, start: int, quote_end: dict[str, int]) -> int | None:
    """Where the value starting at ``start`` ends: a quoted string or a bare word; None if neither."""
    if start >= len(text):
        return None
    first = text[start]
    if first in "\"'":
        # Remember the last closing quote found: many unclosed ``key="`` must not each scan to the end.
        known = quote_end.get(first)
        if known is None or (known != -1 and known <= start):
            known = text.find(first, start + 1)
            quote_end[first] = known
        return None if known == -1 else known + 1
    bare = _BARE_VALUE.match(text, start)
    return bare.end() if bare else None


def _redact_scanned(text: str) -> str:
    text = _redact_pairs(text)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact_text(text: str, *, budget: int | None = SCAN_BUDGET) -> str:
    """Replace secret-looking substrings of free text.

    A string longer than ``budget`` keeps only its scanned head and tail (half the budget each);
    the middle becomes ``[N characters not scanned]``. ``budget=None`` scans everything (still
    linear time, used by tests).
    """
    if budget is None or len(text) <= budget:
        return _redact_scanned(text)
    half = budget // 2
    skipped = len(text) - 2 * half
    return (
        _redact_scanned(text[:half])
        + f" [{skipped:,} characters not scanned] "
        + _redact_scanned(text[len(text) - half :])
    )


def redact(value: Any) -> Any:
    """Deep-copy ``value`` with secrets replaced: values under secret-named keys, and patterns in strings.

    Recursive: callers pass values whose depth is already bounded (``dispatcher.core.jsonlimits``).
    """
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(v, str) and v and isinstance(k, str) and is_secret_key(k)
                else redact(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
