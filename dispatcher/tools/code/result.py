"""A cell's answer as the model reads it: what it printed (stdout and stderr apart), the last
expression's value by MIME type, the figures as PNG image blocks, the error with its traceback;
every part bounded so that the whole stays inside the dispatcher's result budget."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from dispatcher.core.blocks import ContentBlock, ImageBlock, TextBlock, ToolOutput
from dispatcher.tools.text import HeadTailBuffer

STDOUT_HEAD = STDOUT_TAIL = 10 * 1024
STDERR_HEAD = STDERR_TAIL = 2 * 1024
VALUE_CHARS = 8 * 1024
RICH_CHARS = 2 * 1024
"""Each of a value's HTML, Markdown and JSON forms, beside its plain text."""
TRACEBACK_CHARS = 6 * 1024
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 1 << 20
"""Per PNG: four of them stay well inside the result's byte budget (4 MiB)."""
RICH_TEXT = ("text/markdown", "application/json", "text/html")


def cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit:,} more characters]"


@dataclass
class Cell:
    """What one cell gave, gathered as it ran."""

    stdout: HeadTailBuffer = field(default_factory=lambda: HeadTailBuffer(STDOUT_HEAD, STDOUT_TAIL))
    stderr: HeadTailBuffer = field(default_factory=lambda: HeadTailBuffer(STDERR_HEAD, STDERR_TAIL))
    done: dict[str, Any] | None = None
    lost: int = 0
    """Output bytes the worker's ring dropped before they were read."""


def _png(data: object) -> bytes | None:
    if not isinstance(data, str):
        return None
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def render(
    cell: Cell, notes: list[str], metadata: dict[str, Any]
) -> tuple[ToolOutput, dict[str, Any] | None]:
    """The output of a cell, and its error (``{name, value, traceback}``) if it raised one.
    ``metadata`` gains ``execution_count``, ``mime_types``, the streams' sizes."""
    done = cell.done or {}
    sections: list[str] = []
    blocks: list[ContentBlock] = []
    mimes: list[str] = []
    out = cell.stdout.text()
    if out:
        sections.append(out if out.endswith("\n") else out + "\n")
    err = cell.stderr.text()
    if err:
        sections.append("[stderr]\n" + (err if err.endswith("\n") else err + "\n"))
    if cell.lost:
        sections.append(f"[... {cell.lost:,} bytes of output lost: printed faster than they could be read]\n")
    result = done.get("result")
    images: list[bytes] = []
    if isinstance(result, dict):
        for mime in RICH_TEXT:
            text = result.get(mime)
            if isinstance(text, str):
                mimes.append(mime)
                sections.append(f"[{mime}]\n{cut(text, RICH_CHARS)}\n")
        png = _png(result.get("image/png"))
        if png is not None:
            images.append(png)
        plain = result.get("text/plain")
        if isinstance(plain, str):
            mimes.append("text/plain")
            value = cut(plain, VALUE_CHARS)
            sections.append(f"[value]\n{value}\n" if sections else f"{value}\n")
    figures = done.get("figures")
    for figure in figures if isinstance(figures, list) else []:
        png = _png(figure)
        if png is not None:
            images.append(png)
    error = done.get("error")
    failure: dict[str, Any] | None = None
    if isinstance(error, dict):
        trace = error.get("traceback")
        text = "".join(str(line) for line in trace) if isinstance(trace, list) else ""
        failure = {"name": str(error.get("name", "Error")), "value": str(error.get("value", ""))}
        failure["traceback"] = cut(text, TRACEBACK_CHARS)
        if text:
            sections.append(failure["traceback"] if text.endswith("\n") else failure["traceback"] + "\n")
        else:
            sections.append(f"{failure['name']}: {failure['value']}\n")
    shown = 0
    for png in images:
        if shown >= MAX_IMAGES:
            notes.append(f"{len(images) - MAX_IMAGES} more images not shown (at most {MAX_IMAGES} per cell)")
            break
        if len(png) > MAX_IMAGE_BYTES:
            notes.append(
                f"an image of {len(png):,} bytes not shown (at most {MAX_IMAGE_BYTES:,}): save it to a file"
            )
            continue
        blocks.append(ImageBlock(png, "image/png"))
        shown += 1
    if shown:
        mimes.append("image/png")
    sections.extend(f"[{note}]\n" for note in notes)
    text = "".join(sections).rstrip("\n") or "(no output)"
    metadata.update(
        {
            "execution_count": done.get("count"),
            "mime_types": mimes,
            "images": shown,
            "stdout_bytes": cell.stdout.total,
            "stderr_bytes": cell.stderr.total,
        }
    )
    if cell.lost:
        metadata["output_lost_bytes"] = cell.lost
    if failure is not None:
        metadata["error"] = {"name": failure["name"], "value": cut(failure["value"], 1024)}
    return ToolOutput([TextBlock(text), *blocks], success=failure is None, metadata=metadata), failure
