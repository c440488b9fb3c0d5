"""The request-level bounds the server checks before any work: ids, labels, how many tool_uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatcher.server.requests.errors import InvalidRequest

MAX_LABELS = 64
MAX_LABEL_CHARS = 256
MAX_ID_CHARS = 256
"""session_id, turn_id, tool_use ids, tool names and request_id: a request past it is refused."""
MAX_TOOL_USES = 128
"""tool_uses in one Dispatch."""


def check_labels(labels: Mapping[str, str]) -> None:
    if len(labels) > MAX_LABELS:
        raise InvalidRequest(f"labels: at most {MAX_LABELS} labels")
    for key, value in labels.items():
        if not key or len(key) > MAX_LABEL_CHARS or len(value) > MAX_LABEL_CHARS:
            raise InvalidRequest(
                f"labels.{key[:40]}: keys must be 1..{MAX_LABEL_CHARS} chars, values at most that"
            )


def check_id(name: str, value: str) -> None:
    if len(value) > MAX_ID_CHARS:
        raise InvalidRequest(f"{name}: at most {MAX_ID_CHARS} characters, got {len(value):,}")


def check_dispatch_request(turn_id: str, tool_uses: Sequence[tuple[str, str]]) -> None:
    """The request-level rules of Dispatch: ``turn_id`` and each tool_use's ``(id, name)`` bounded,
    at most ``MAX_TOOL_USES`` tool_uses, ids present and unique.

    Raises:
        InvalidRequest: naming the offending field.
    """
    check_id("turn_id", turn_id)
    if len(tool_uses) > MAX_TOOL_USES:
        raise InvalidRequest(f"tool_uses: at most {MAX_TOOL_USES} per Dispatch, got {len(tool_uses)}")
    for i, (tool_use_id, name) in enumerate(tool_uses):
        check_id(f"tool_uses[{i}].id", tool_use_id)
        check_id(f"tool_uses[{i}].name", name)
    check_tool_use_ids([tool_use_id for tool_use_id, _ in tool_uses])


def check_tool_use_ids(ids: Sequence[str]) -> None:
    """The request-level rules of Dispatch: at least one tool_use, ids present and unique.

    Raises:
        InvalidRequest: naming the offending position.
    """
    if not ids:
        raise InvalidRequest("tool_uses: at least one tool_use is required")
    seen: set[str] = set()
    for i, tool_use_id in enumerate(ids):
        if not tool_use_id:
            raise InvalidRequest(f"tool_uses[{i}].id: must not be empty")
        if tool_use_id in seen:
            raise InvalidRequest(f"tool_uses[{i}].id: duplicate id {tool_use_id!r}")
        seen.add(tool_use_id)
