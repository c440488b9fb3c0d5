"""What every section of the config file shares: closed pydantic models, strict value types, and
errors that name the dotted key.

A section is a frozen model that refuses unknown keys and takes ``null`` for "all defaults". Numbers
and flags are strict (``"10"`` is not a number and ``1`` is not ``true``); a float field takes an
integer. ``validate_section`` turns pydantic's errors into one ``ConfigError`` whose every line starts
with the key it is about (``tenants[1].quotas.max_sessions: must be greater than 0, got 0``).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from dispatcher.core.errors import ConfigError

__all__ = [
    "HostPort",
    "KeyProblem",
    "PositiveInt",
    "Seconds",
    "Section",
    "Text",
    "check_host_port",
    "check_listen",
    "config_error",
    "dotted",
    "validate_section",
]

PositiveInt = Annotated[int, Strict(), Field(gt=0)]
Seconds = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
"""A positive, finite number of seconds (an integer is fine)."""
Text = Annotated[str, Strict(), Field(min_length=1)]


def check_host_port(value: object) -> str:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6), port 0 to 65535, no whitespace.

    Raises:
        ValueError: not of that form.
    """
    if isinstance(value, str):
        host, sep, port = value.rpartition(":")
        if sep and host and port.isdigit() and int(port) <= 65535 and not any(c.isspace() for c in value):
            return value
    raise ValueError(f"expected HOST:PORT, got {value!r}")


def check_listen(value: object, where: str) -> str:
    """``check_host_port`` for an address given outside a section (a flag, the environment).

    Raises:
        ConfigError: naming ``where``.
    """
    try:
        return check_host_port(value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


HostPort = Annotated[
    str,
    BeforeValidator(
        check_host_port,
        json_schema_input_type=Annotated[str, Field(pattern=r"^\S+:[0-9]{1,5}$")],
    ),
]
_SHOWN_INPUT = 60


class Section(BaseModel):
    """A closed, frozen section of the config file; ``null`` means every default."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: Any) -> Any:
        return {} if data is None else data


class KeyProblem(ValueError):
    """Raised by a model validator about one of its keys: the error names ``<section>.<key>``
    (an int: ``<section>[<key>]``, an item of a list)."""

    def __init__(self, key: str | int, message: str) -> None:
        super().__init__(message)
        self.key = key


def validate_section(kind: Any, data: Any, where: str) -> Any:
    """``data`` validated as ``kind`` (a model class or any type pydantic takes).

    Raises:
        ConfigError: every problem, one per line, each naming its key under ``where``.
    """
    adapter = TypeAdapter(kind)
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        raise config_error(exc, where, kind) from None


def config_error(exc: ValidationError, where: str, root: Any) -> ConfigError:
    """One ``ConfigError`` for pydantic's errors; ``root`` is the type validated at ``where``."""
    lines = []
    for error in exc.errors(include_url=False):
        loc = [part for part in error["loc"] if part != "[key]"]
        problem = (error.get("ctx") or {}).get("error")
        if isinstance(problem, KeyProblem):
            loc.append(problem.key)
        lines.append(f"{dotted(where, loc)}: {_message(error, root, loc)}")
    return ConfigError("\n".join(lines))


def dotted(where: str, loc: Sequence[str | int]) -> str:
    """``tenants`` + ``(1, "quotas")`` -> ``tenants[1].quotas``."""
    out = where
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Any, root: Any, loc: list[str | int]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _keys_at(root, loc[:-1])
        return "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
    if kind == "missing":
        return "is required"
    if kind in ("model_type", "model_attributes_type", "dict_type", "mapping_type"):
        return "must be a mapping"
    if kind == "value_error":
        return str(error["ctx"]["error"])
    message = str(error["msg"])
    message = message[0].lower() + message[1:] if message else message
    for old, new in (("input should be", "must be"), ("string should", "must")):
        if message.startswith(old):
            message = new + message[len(old) :]
    shown = repr(error.get("input"))
    if len(shown) > _SHOWN_INPUT:
        shown = shown[: _SHOWN_INPUT - 3] + "..."
    return f"{message}, got {shown}"


def _keys_at(root: Any, loc: Sequence[str | int]) -> list[str]:
    """The keys the model reached by ``loc`` from ``root`` takes (empty: not a model)."""
    node = _unwrap(root)
    for part in loc:
        if isinstance(node, type) and issubclass(node, BaseModel) and isinstance(part, str):
            field = node.model_fields.get(part)
            if field is None:
                return []
            node = _unwrap(field.annotation)
            continue
        args = get_args(node)
        if not args:
            return []
        node = _unwrap(args[-1])  # list[X], tuple[X, ...] -> X; dict[K, V] -> V
        if node is Ellipsis:
            node = _unwrap(args[0])
    if isinstance(node, type) and issubclass(node, BaseModel):
        return sorted(node.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """Annotated[X, ...] -> X and X | None -> X."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin is Union or origin is types.UnionType:
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation
