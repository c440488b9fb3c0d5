"""Registry invariants (spec 000 §3.1, 001, 002) and the three export shapes."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core import (
    RegistrySealedError,
    SideEffect,
    ToolDefinition,
    ToolNameConflictError,
    ToolRegistrationError,
    ToolRegistry,
    to_anthropic,
    to_mcp,
    to_openai,
)
from tests.unit.core.toolkit import OBJ, EchoTool, ReadTool, WriteTool, definition


def tool_class(defn: ToolDefinition) -> type:
    class T:
        definition = defn

        async def execute(self, input: dict[str, Any], context: Any) -> Any:
            raise NotImplementedError

        async def cancel(self) -> bool:
            return False

    return T


def test_list_is_sorted_and_names_are_exact_case() -> None:
    reg = ToolRegistry()
    for factory in (WriteTool, EchoTool, ReadTool):
        reg.register(factory)
    assert reg.list() == ["echo", "read", "write"]
    assert reg.get("Echo") is None and reg.get("echo") is not None


def test_singleton_factory_is_rejected() -> None:
    shared = EchoTool()
    with pytest.raises(ToolRegistrationError, match="same object twice"):
        ToolRegistry().register(lambda: shared)


def test_non_callable_and_bad_objects_are_rejected() -> None:
    reg = ToolRegistry()
    with pytest.raises(ToolRegistrationError, match="zero-argument factory"):
        reg.register(EchoTool())  # type: ignore[arg-type]
    with pytest.raises(ToolRegistrationError, match="without a ToolDefinition"):
        reg.register(object)  # type: ignore[arg-type]


def test_duplicate_name_is_a_registration_error() -> None:
    reg = ToolRegistry()
    reg.register(EchoTool)
    with pytest.raises(ToolRegistrationError, match="already registered") as info:
        reg.register(tool_class(definition("echo")))
    assert not isinstance(info.value, ToolNameConflictError)


def test_user_tool_taking_a_builtin_name_is_a_conflict() -> None:
    reg = ToolRegistry()
    reg.register(EchoTool, builtin=True)
    with pytest.raises(ToolNameConflictError):
        reg.register(tool_class(definition("echo")))


@pytest.mark.parametrize("name", ["", "has space", "a/b", "x" * 129, "tab\t"])
def test_names_must_match_the_pattern(name: str) -> None:
    with pytest.raises(ToolRegistrationError, match="must match"):
        ToolRegistry().register(tool_class(definition(name)))


def test_names_at_the_limits_are_accepted() -> None:
    reg = ToolRegistry()
    reg.register(tool_class(definition("x" * 128)))
    reg.register(tool_class(definition("mcp_github.create-issue_2")))
    assert len(reg) == 2


def test_side_effect_must_be_declared() -> None:
    bad = ToolDefinition("t", "d", {"type": "object"}, side_effect="write")  # type: ignore[arg-type]
    with pytest.raises(ToolRegistrationError, match="SideEffect"):
        ToolRegistry().register(tool_class(bad))


def test_requires_fs_must_name_an_input() -> None:
    bad = definition("t", requires_fs=(("file", "r"),))
    with pytest.raises(ToolRegistrationError, match="unknown input 'file'"):
        ToolRegistry().register(tool_class(bad))


def test_sealed_registry_refuses_changes() -> None:
    reg = ToolRegistry()
    reg.register(EchoTool)
    reg.seal()
    with pytest.raises(RegistrySealedError):
        reg.register(ReadTool)
    with pytest.raises(RegistrySealedError):
        reg.unregister("echo")
    assert reg.list() == ["echo"]


def test_unregister_is_idempotent() -> None:
    reg = ToolRegistry()
    reg.register(EchoTool)
    reg.unregister("echo")
    reg.unregister("echo")
    assert reg.list() == []


def test_export_shapes() -> None:
    d = WriteTool.definition
    assert to_anthropic(d) == {
        "name": "write",
        "description": "write tool",
        "input_schema": dict(d.input_schema),
    }
    openai = to_openai(d)
    assert openai["type"] == "function" and openai["function"]["parameters"] == dict(d.input_schema)
    mcp = to_mcp(d)
    assert mcp["inputSchema"] == dict(d.input_schema)
    assert mcp["annotations"]["readOnlyHint"] is False and mcp["annotations"]["destructiveHint"] is True
    assert to_mcp(ReadTool.definition)["annotations"]["readOnlyHint"] is True


def test_definition_keeps_declared_side_effect() -> None:
    reg = ToolRegistry()
    reg.register(WriteTool)
    assert reg.definitions()[0].side_effect is SideEffect.WRITE


def test_schema_with_forbidden_construct_is_rejected_at_registration() -> None:
    schema = {**OBJ, "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}
    with pytest.raises(ToolRegistrationError, match=r"\$\.properties\.x\.anyOf"):
        ToolRegistry().register(tool_class(definition("t", input_schema=schema)))
