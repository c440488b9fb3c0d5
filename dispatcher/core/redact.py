"""Secret redaction of tool arguments before they reach events, logs and the audit log (spec 004)."""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[REDACTED]"

# A key is secret-named when one of its _/-/. separated parts says so ("db_password", "apiKey").
_SECRET_KEY = re.compile(
    r"(?i)(^|[_.-])(pass(word|wd|phrase)?|secret|token|api[_-]?key|apikey|access[_-]?key|"
    r"private[_-]?key|authorization|credentials?|cookie)s?($|[_.-])|[a-z](Password|Secret|Token|ApiKey)$"
)
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # key=value / key: value pairs in free text (commands, env dumps, URLs' query strings)
    (
        re.compile(
            r"(?i)\b([A-Za-z0-9_.-]*(?:pass(?:word|wd)?|secret|token|api[_-]?key|access[_-]?key)"
            r"[A-Za-z0-9_.-]*)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s&;'\"]+)"
        ),
        r"\1\2" + REDACTED,
    ),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S), REDACTED),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_-]{16,}"), REDACTED),  # OpenAI/Anthropic/Stripe-style keys
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"), REDACTED),  # GitHub tokens
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),  # Slack tokens
    (re.compile(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b"), REDACTED),  # AWS access key ids
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), REDACTED),  # JWTs
    (re.compile(r"(://[^/\s:@]+:)[^@\s/]+@"), r"\1" + REDACTED + "@"),  # user:pass@ in URLs
)


def redact_text(text: str) -> str:
    """Replace secret-looking substrings of free text."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any) -> Any:
    """Deep-copy ``value`` with secrets replaced: values under secret-named keys, and patterns in strings."""
    if isinstance(value, dict):
        return {
            k: (
                REDACTED
                if isinstance(v, str) and v and isinstance(k, str) and _SECRET_KEY.search(k)
                else redact(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
