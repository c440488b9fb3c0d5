"""The provider-safe JSON Schema subset (spec 000 §7)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core import ToolRegistrationError
from dispatcher.core.schema import check_schema, validation_errors

OK: dict[str, Any] = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "where", "format": "uri-reference"},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "n": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "opts": {"type": "object", "properties": {"x": {"type": "boolean"}}, "additionalProperties": False},
        # A property may be *named* like a keyword: names are data, not schema.
        "not": {"type": "null"},
    },
    "required": ["path"],
    "additionalProperties": False,
}


def test_allowed_subset_compiles() -> None:
    validator = check_schema("t", OK)
    assert validation_errors(validator, {"path": "a", "not": None}) == []


@pytest.mark.parametrize(
    "fragment",
    [
        {"$ref": "#/definitions/x"},
        {"oneOf": [{"type": "string"}]},
        {"anyOf": [{"type": "string"}]},
        {"allOf": [{"type": "string"}]},
        {"not": {"type": "string"}},
        {"if": {"type": "string"}, "then": {"minLength": 1}, "else": {"type": "null"}},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
    ],
)
def test_forbidden_constructs_rejected_anywhere(fragment: dict[str, Any]) -> None:
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": fragment}}}
    with pytest.raises(ToolRegistrationError, match=r"\$\.properties\.a\.items\."):
        check_schema("t", nested)


@pytest.mark.parametrize("root", [{"type": "array"}, {"properties": {}}, {"type": ["object", "null"]}])
def test_root_must_be_type_object(root: dict[str, Any]) -> None:
    with pytest.raises(ToolRegistrationError, match="root must be 'type: object'"):
        check_schema("t", root)


def test_invalid_draft7_is_rejected() -> None:
    with pytest.raises(ToolRegistrationError, match="invalid input_schema"):
        check_schema("t", {"type": "object", "properties": {"a": {"type": "strang"}}})


def test_enum_values_are_data() -> None:
    check_schema("t", {"type": "object", "properties": {"k": {"enum": ["oneOf", {"$ref": "x"}]}}})


def test_errors_carry_json_paths() -> None:
    validator = check_schema("t", OK)
    errors = validation_errors(validator, {"path": 1, "tags": ["ok", 2], "opts": {"x": "yes"}, "n": -1})
    assert "$.path: 1 is not of type 'string'" in errors
    assert "$.tags[1]: 2 is not of type 'string'" in errors
    assert "$.opts.x: 'yes' is not of type 'boolean'" in errors
    assert "$.n: -1 is less than the minimum of 0" in errors
