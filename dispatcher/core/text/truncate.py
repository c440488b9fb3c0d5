"""Head + tail truncation of long text (spec 004), with a marker saying how much was cut."""

from __future__ import annotations


def truncate_head_tail(text: str, budget: int) -> str:
    """Keep the first and last parts of ``text`` so the result fits ``budget`` characters."""
    if budget <= 0 or len(text) <= budget:
        return text
    cut = len(text) - budget
    marker = f"\n\n[... {cut:,} characters truncated ...]\n\n"
    keep = max(budget - len(marker), 0)
    head = keep * 2 // 3  # the start of output usually says what happened; keep more of it
    tail = keep - head
    cut = len(text) - head - tail
    marker = f"\n\n[... {cut:,} characters truncated ...]\n\n"
    return text[:head] + marker + (text[-tail:] if tail else "")
