"""Who an agent is, as the next channel's giver finds and checks it: the grants it parses from its
arguments, and the abstract socket it waits at once its channel ends (``handover.py``). The host
reaches these through ``protocol.py``, the only agent module it imports."""

from __future__ import annotations

import hashlib
import json
import os


def parse_grants(raw: str | None) -> list[tuple[str, str]] | None:
    """The ``--grants`` JSON as (normalised relative prefix, mode) pairs; None when not given."""
    if raw is None:
        return None
    items = json.loads(raw)
    if not isinstance(items, list):
        raise ValueError("expected a JSON list")
    grants = []
    for item in items:
        if (
            not isinstance(item, dict)
            or type(item.get("path")) is not str
            or item.get("mode") not in ("r", "rw")
        ):
            raise ValueError(f"bad grant {item!r}")
        prefix = os.path.normpath(item["path"].strip("/") or ".")
        if prefix.split("/")[0] == ".." or "\x00" in prefix:
            raise ValueError(f"grant {item['path']!r} leaves the root")
        grants.append((prefix, item["mode"]))
    return grants


def waiting_socket_name(uid: int, real_root: str) -> str:
    """The abstract unix socket where an agent running as ``uid``, whose root resolves to
    ``real_root``, waits for its next channel."""
    digest = hashlib.sha256(real_root.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return f"\0dispatcher-agent/{uid}/{digest}"
