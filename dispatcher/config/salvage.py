"""Reading a config file past the keys that fail their own validation, so ``config-check`` reports
what the rest of the file gets wrong in the same run.

A key that fails its own validation (an fs grant ``../etc``, a negative limit) stops the model from
being built, and with it every check that needs the whole config: the tool names in ``timeouts``,
``tool_confirmation`` and ``tenants[].tools``. So, once those keys are reported, the file is
validated again without them, and the remaining checks run on that:

- each failing key is removed from the mapping that holds it (the deepest mapping key on its path
  that the file has), never an item from a list: that would renumber the items after it, and the
  lines reported would name the wrong entry;
- removing a key can make another fail (a required key now missing): the rounds repeat, a few
  times at most, but only the first round's errors are the file's, so only they are reported;
- ``tools`` and ``mcp_servers`` are never removed: they make the tool names known, and without
  them every name would look unknown.

None when nothing can be salvaged (a failing key at the top with no key to remove, a protected
key, or still failing after the rounds): then the checks wait for the next run, as before.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

from dispatcher.config_base import KeyProblem

__all__ = ["salvage"]

Loc = tuple[str | int, ...]

PROTECTED = frozenset({"tools", "mcp_servers"})
"""Top-level keys whose removal would make every tool name look unknown."""
ROUNDS = 8


def salvage(kind: Any, data: Mapping[str, Any]) -> Any | None:
    """``data`` validated as ``kind`` once the keys failing their own validation are removed (a
    copy: ``data`` is left alone); None when that does not validate either."""
    adapter: TypeAdapter[Any] = TypeAdapter(kind)
    pruned: Any = copy.deepcopy(dict(data))
    for _ in range(ROUNDS):
        try:
            return adapter.validate_python(pruned)
        except ValidationError as exc:
            for loc in _locs(exc):
                removed = _remove(pruned, loc)
                if removed is None or removed[0] in PROTECTED:
                    return None
    return None


def _locs(exc: ValidationError) -> Iterator[Loc]:
    """Where each error is, in the file's own keys (a model validator's ``KeyProblem`` names its
    key; ``[key]``, a mapping key that is itself invalid, is that key's place)."""
    for error in exc.errors(include_url=False):
        loc = [part for part in error["loc"] if part != "[key]"]
        problem = (error.get("ctx") or {}).get("error")
        if isinstance(problem, KeyProblem):
            loc.append(problem.key)
        yield tuple(loc)


def _remove(data: Any, loc: Loc) -> Loc | None:
    """Remove the deepest mapping key along ``loc`` that ``data`` has; its path, or None (none)."""
    node = data
    deepest: tuple[dict[Any, Any], Any, Loc] | None = None
    for depth, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            deepest = (node, part, loc[: depth + 1])
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break  # a union's branch name, or a key the file does not have
    if deepest is None:
        return None
    holder, key, path = deepest
    del holder[key]
    return path
