"""Results in bytes: what one result weighs on the wire, and fitting it under a byte budget.

A transport sends each result as one message. A result bigger than the transport's limit (a 4.7 MB
image under gRPC's 4 MiB) would end the whole stream, and the sibling calls' results with it, so
the pipeline fits every result here, images included, to ``DispatcherConfig.result_budget_bytes``:
text is cut head+tail, an image that does not fit is left out with a note (the pipeline turns a
success that lost an image into an error result), and what is left is always valid UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from dispatcher.core.text.truncate import truncate_head_tail
from dispatcher.core.types import ContentBlock, ImageBlock, TextBlock, ToolResultBlock

RESULT_BUDGET_BYTES = (4 << 20) - (64 << 10)
"""The default budget: a gRPC server's default 4 MiB message less room for the rest of the message."""
ENVELOPE_BYTES = 64
"""Counted per block and per field for tags, lengths and the message around them (generous)."""
_NOTE_ROOM = 512  # kept free for the notes that say what was left out


def encodable(text: str) -> tuple[str, int]:
    """``text`` made valid for UTF-8 (a lone surrogate, a name's undecodable byte, becomes the
    visible escape ``\\udcXX``) and its size in UTF-8 bytes."""
    if text.isascii():
        return text, len(text)
    try:
        return text, len(text.encode("utf-8"))
    except UnicodeEncodeError:
        data = text.encode("utf-8", "backslashreplace")
        return data.decode("utf-8"), len(data)


def image_overflow(content: Sequence[ContentBlock], budget: int) -> str | None:
    """Why ``content`` cannot be returned whole within ``budget`` bytes because of an image, or None."""
    if not any(isinstance(b, ImageBlock) for b in content):
        return None
    _, omitted = fit_content(content, budget)
    if not omitted:
        return None
    return (
        f"The result is too large to return: {'; '.join(omitted)}; one result may carry at most "
        f"{budget:,} bytes. Make the image smaller first (for example with shell) and read that."
    )


def fit_chars(content: Sequence[ContentBlock], budget: int) -> tuple[ContentBlock, ...]:
    """``content`` with its text blocks cut head+tail so that together they hold about ``budget``
    characters: the budget is the result's, not each block's. Blocks under an equal share stay
    whole; the longer ones share what is left equally (each gets a cut marker of its own)."""
    lengths = [len(b.text) for b in content if isinstance(b, TextBlock)]
    if sum(lengths) <= budget:
        return tuple(content)
    share = _fair_share(lengths, budget)
    return tuple(
        TextBlock(truncate_head_tail(b.text, max(share, 1))) if isinstance(b, TextBlock) else b
        for b in content
    )


def _fair_share(lengths: Sequence[int], budget: int) -> int:
    """The largest cap such that ``sum(min(n, cap))`` stays within ``budget``."""
    left, count = budget, len(lengths)
    for n in sorted(lengths):
        if n * count > left:
            return left // count
        left -= n
        count -= 1
    return budget


def fit_content(content: Sequence[ContentBlock], budget: int) -> tuple[list[ContentBlock], list[str]]:
    """The blocks that fit ``budget`` bytes, in order, and a description of each image left out.

    Text that does not fit is cut head+tail to the room left; an image that does not fit becomes a
    short note. The notes themselves are bounded: past the budget, the rest collapses into one.
    """
    out: list[ContentBlock] = []
    omitted: list[str] = []
    room = max(budget - _NOTE_ROOM, 0)
    used = 0
    for index, block in enumerate(content):
        if used >= room:
            rest = len(content) - index
            out.append(
                TextBlock(f"[{rest} more content block(s) left out: the result reached its size limit]")
            )
            omitted.extend(_describe(b) for b in content[index:] if isinstance(b, ImageBlock))
            break
        if isinstance(block, ImageBlock):
            size = len(block.data) + len(block.media_type) + ENVELOPE_BYTES
            if used + size <= room:
                out.append(block)
                used += size
                continue
            what = _describe(block)
            omitted.append(what)
            note = f"[{what} left out: too large for one result]"
            out.append(TextBlock(note))
            used += len(note) + ENVELOPE_BYTES
            continue
        text, size = encodable(block.text)
        if used + size + ENVELOPE_BYTES > room:
            # At most 4 UTF-8 bytes a character: cutting to a quarter of the room in characters fits.
            text = truncate_head_tail(text, max((room - used - ENVELOPE_BYTES) // 4, 1))
            text, size = encodable(text)
        out.append(TextBlock(text) if text is not block.text else block)
        used += size + ENVELOPE_BYTES
    return out, omitted


def fit_result(result: ToolResultBlock, budget: int) -> ToolResultBlock:
    """``result`` within ``budget`` bytes in all (content, command, paths, metadata), valid UTF-8."""
    part = budget // 8  # the most any one non-content field may take
    command = result.command_executed
    fixed = len(result.tool_use_id) + 4 * ENVELOPE_BYTES
    if command is not None:
        command, size = encodable(command)
        if size > part:
            command, size = encodable(truncate_head_tail(command, part // 4))
        fixed += size
    files: list[str] = []
    files_size = 0
    for path in result.files_modified:
        path, size = encodable(path)
        if files_size + size + ENVELOPE_BYTES > part:
            break
        files.append(path)
        files_size += size + ENVELOPE_BYTES
    fixed += files_size
    metadata = dict(result.metadata)
    if metadata:
        metadata_size = _json_size(metadata)
        if metadata_size is None or metadata_size > part:
            metadata = {"metadata_left_out": "too large or not JSON"}
            metadata_size = 64
        fixed += metadata_size
    content, _ = fit_content(result.content, max(budget - fixed, 0))
    return replace(
        result,
        content=tuple(content),
        command_executed=command,
        files_modified=tuple(files),
        metadata=metadata,
    )


def result_bytes(result: ToolResultBlock) -> int:
    """An estimate (from above) of the bytes ``result`` takes on the wire and in memory."""
    total = len(result.tool_use_id) + 4 * ENVELOPE_BYTES
    for block in result.content:
        if isinstance(block, ImageBlock):
            total += len(block.data) + ENVELOPE_BYTES
        else:
            total += 4 * len(block.text) + ENVELOPE_BYTES
    total += 4 * len(result.command_executed or "")
    total += sum(4 * len(p) + ENVELOPE_BYTES for p in result.files_modified)
    if result.metadata:
        total += _json_size(dict(result.metadata)) or 0
    return total


def _describe(block: ImageBlock) -> str:
    return f"{block.media_type} image of {len(block.data):,} bytes"


def _json_size(value: Any) -> int | None:
    try:
        return len(json.dumps(value, default=str))
    except (TypeError, ValueError, RecursionError):
        return None
