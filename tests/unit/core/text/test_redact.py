"""Redaction runs in linear time with a per-string budget, whatever a tenant puts in a string.

No absolute timings: each hostile input is compared with a harmless one of the same size, redacted
in the same test, with a generous factor. The patterns these inputs target took quadratic time
before (3 s for two 2 KB strings; hours for 4 MB).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from dispatcher.core.text.redact import REDACTED, SCAN_BUDGET, redact, redact_text

FACTOR = 25  # hostile / harmless time; quadratic behaviour is thousands of times slower at these sizes


def _fill(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def _best_time(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _assert_linear(hostile: str, harmless: str, fn: Callable[[str], object]) -> None:
    baseline = _best_time(lambda: fn(harmless))
    measured = _best_time(lambda: fn(hostile))
    assert measured <= FACTOR * baseline + 0.05, (measured, baseline)


def test_the_reported_input_is_redacted_quickly() -> None:
    s = ("passwd." * 300)[:1999]
    _assert_linear(s, _fill("the quick brown fox ", len(s)), lambda t: redact({"a": t, "b": t}))


HOSTILE_UNITS = [
    "passwd.",  # the secret-key pair pattern: key run overlapping the keyword
    'password="',  # many unclosed quoted values
    "password='x ",
    "a=",
    "-----BEGIN RSA PRIVATE KEY-----",  # blocks without an END line
    "-----BEGIN " + "A" * 80,
    "-----END RSA PRIVATE KEY-----",
    "://a:",
    "://aaaaaaaa:bbbbbbbbbb",
    "bearer ",
    "eyJaaaaaaaa.",
    "sk-",
    "ghp_",
    "xoxb-",
    "AKIA",
    " \t",
    "passwd.token=:api_key \"'",
]


@pytest.mark.parametrize("unit", HOSTILE_UNITS)
def test_every_pattern_is_linear_on_a_whole_string(unit: str) -> None:
    size = 256 * 1024
    _assert_linear(
        _fill(unit, size), _fill("the quick brown fox jumps; ", size), lambda t: redact_text(t, budget=None)
    )


def test_a_4_mib_hostile_input_costs_what_a_harmless_one_does() -> None:
    size = 4 << 20
    hostile = {"a": _fill("passwd.", size // 2), "b": _fill('password="', size // 2)}
    harmless = {"a": "x" * (size // 2), "b": "y" * (size // 2)}
    baseline = _best_time(lambda: redact(harmless))
    assert _best_time(lambda: redact(hostile)) <= FACTOR * baseline + 0.05


def test_a_long_string_keeps_its_scanned_head_and_tail_only() -> None:
    text = "password=head1 " + "x" * (SCAN_BUDGET * 4) + " token=tail1"
    out = redact_text(text)
    assert len(out) < SCAN_BUDGET + 100
    assert "head1" not in out and "tail1" not in out and out.count(REDACTED) == 2
    assert f"[{len(text) - SCAN_BUDGET:,} characters not scanned]" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--password=hunter22 x", "--password=[REDACTED] x"),
        ('DB_PASS: "a b c" next', 'DB_PASS: "[REDACTED]" next'.replace('"[REDACTED]"', REDACTED)),
        ("a=password=secret", "a=password=[REDACTED]"),
        ("x.api_key = 'k k'&y=1", "x.api_key = [REDACTED]&y=1"),
        ("width=3 height=4", "width=3 height=4"),
        ("password=", "password="),
        ('token="unclosed', 'token="unclosed'),
    ],
)
def test_key_value_pairs(text: str, expected: str) -> None:
    assert redact_text(text) == expected


def test_a_private_key_without_its_end_line_is_redacted_to_the_end() -> None:
    out = redact_text("key: -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA")
    assert "b3Blbn" not in out and REDACTED in out
