"""The built-in tools' definitions: fixed names, the provider-safe schema subset, fresh instances."""

from __future__ import annotations

import pytest

from dispatcher.core.schema import check_schema, validation_errors
from dispatcher.core.types import SideEffect, Tool
from dispatcher.tools import BUILTIN_TOOLS, builtin_factories


def test_the_built_in_tools_with_fixed_names_and_classes() -> None:
    effects = {factory().definition.name: factory().definition.side_effect for factory in BUILTIN_TOOLS}
    assert effects == {
        "read_file": SideEffect.READ,
        "write_file": SideEffect.WRITE,
        "patch_file": SideEffect.WRITE,
        "list_dir": SideEffect.READ,
        "glob": SideEffect.READ,
        "grep": SideEffect.READ,
        "shell": SideEffect.EXECUTE,
        "run_code": SideEffect.EXECUTE,
        "process_list": SideEffect.READ,
        "process_output": SideEffect.READ,
        "process_input": SideEffect.EXECUTE,
        "process_stop": SideEffect.EXECUTE,
    }
    assert builtin_factories() == BUILTIN_TOOLS and builtin_factories() is not BUILTIN_TOOLS


@pytest.mark.parametrize("factory", BUILTIN_TOOLS)
def test_factories_make_distinct_protocol_instances(factory: type) -> None:
    first, second = factory(), factory()
    assert first is not second and isinstance(first, Tool)


@pytest.mark.parametrize("factory", BUILTIN_TOOLS)
def test_schemas_are_in_the_allowed_subset(factory: type) -> None:
    definition = factory().definition
    check_schema(definition.name, definition.input_schema)
    assert definition.input_schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("read_file", {"path": "a", "offset": 2, "limit": 5}, {"path": "a", "offset": 0}),
        ("write_file", {"path": "a", "content": ""}, {"path": "a"}),
        ("patch_file", {"path": "a", "old": "x", "new": ""}, {"path": "a", "old": "", "new": "y"}),
        (
            "patch_file",
            {"path": "a", "old": "x", "new": "", "replace_all": True},
            {"path": "a", "old": "x", "new": "", "replace_all": "yes"},
        ),
        ("glob", {"pattern": "**/*.py", "path": "src"}, {"pattern": ""}),
        (
            "grep",
            {"pattern": "x", "glob": "*.py", "ignore_case": True, "context_lines": 2, "max_results": 5},
            {"pattern": "x", "context_lines": 11},
        ),
        ("grep", {"pattern": "x"}, {"pattern": "x", "max_results": 1001}),
        ("list_dir", {}, {"path": "a", "recursive": True}),
        ("shell", {"command": "ls", "timeout_seconds": 1.5}, {"command": "ls", "timeout_seconds": 0}),
    ],
)
def test_schemas_accept_and_reject(name: str, good: dict[str, object], bad: dict[str, object]) -> None:
    (definition,) = [f().definition for f in BUILTIN_TOOLS if f().definition.name == name]
    validator = check_schema(name, definition.input_schema)
    assert validation_errors(validator, good) == []
    assert validation_errors(validator, bad) != []


def test_file_tools_declare_their_path_argument() -> None:
    modes = {f().definition.name: f().definition.requires_fs for f in BUILTIN_TOOLS}
    assert modes["read_file"] == (("path", "r"),) and modes["list_dir"] == (("path", "r"),)
    assert modes["glob"] == (("path", "r"),) and modes["grep"] == (("path", "r"),)
    assert modes["write_file"] == (("path", "rw"),) and modes["patch_file"] == (("path", "rw"),)
    assert modes["shell"] == (("cwd", "cwd"),)  # a working directory, checked like a path
