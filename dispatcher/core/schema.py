"""The provider-safe JSON Schema subset (spec 000 §7): checked at registration, validated per call."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from jsonschema import Draft7Validator
from jsonschema.exceptions import SchemaError

from dispatcher.core.errors import ToolRegistrationError
from dispatcher.core.types import UnparsedInput

FORBIDDEN_KEYWORDS = frozenset(
    {"$ref", "oneOf", "anyOf", "allOf", "not", "if", "then", "else", "patternProperties"}
)
# Keywords whose value is a map of name -> subschema, so the names are data, not keywords.
_SCHEMA_MAPS = frozenset({"properties", "definitions", "$defs", "dependencies"})


def _walk(node: Any, path: str) -> Iterator[tuple[str, str]]:
    """Yield (json path, problem) for every forbidden construct under ``node``."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _walk(item, f"{path}[{i}]")
        return
    if not isinstance(node, Mapping):
        return
    for key, value in node.items():
        where = f"{path}.{key}"
        if key in FORBIDDEN_KEYWORDS:
            yield where, f"'{key}' is not allowed"
        elif key == "additionalProperties" and not isinstance(value, bool):
            yield where, "'additionalProperties' must be a boolean, not a schema"
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for name, sub in value.items():
                yield from _walk(sub, f"{where}.{name}")
        elif key in ("enum", "const", "default", "examples"):
            continue  # literal data, never schema
        else:
            yield from _walk(value, where)


def check_schema(tool_name: str, schema: Mapping[str, Any]) -> Draft7Validator:
    """Reject disallowed constructs and compile the tool's validator once.

    Raises:
        ToolRegistrationError: the schema is outside the subset or not valid Draft 7.
    """
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise ToolRegistrationError(f"tool {tool_name!r}: input_schema root must be 'type: object'")
    problems = [f"{where}: {why}" for where, why in _walk(schema, "$")]
    if problems:
        raise ToolRegistrationError(f"tool {tool_name!r}: input_schema uses " + "; ".join(problems))
    try:
        Draft7Validator.check_schema(schema)
    except SchemaError as exc:
        raise ToolRegistrationError(f"tool {tool_name!r}: invalid input_schema: {exc.message}") from exc
    return Draft7Validator(schema, format_checker=Draft7Validator.FORMAT_CHECKER)


def validation_errors(validator: Draft7Validator, instance: Any) -> list[str]:
    """Every violation of ``instance``, each prefixed with its JSON path, in a stable order."""
    if isinstance(instance, UnparsedInput):
        return [f"$: {instance.problem}: {instance.error}"]
    if not isinstance(instance, dict):
        kind = "null" if instance is None else type(instance).__name__
        return [f"$: input must be a JSON object, got {kind}"]
    errors = sorted(
        validator.iter_errors(instance), key=lambda e: (list(map(str, e.absolute_path)), e.message)
    )
    return [f"{e.json_path}: {e.message}" for e in errors]
