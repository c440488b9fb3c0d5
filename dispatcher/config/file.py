"""The whole config file as one model, and the JSON Schema it makes (``dispatcher config-schema``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, Strict

from dispatcher.config import DEFAULT_HOME, DEFAULT_LISTEN
from dispatcher.config.egress import EgressSection
from dispatcher.config.policy import DEFAULT_APPROVAL_MODES, ApprovalModesOrNull, ToolConfirmation
from dispatcher.config.sections import (
    DispatcherSection,
    DispatchSection,
    LogSection,
    McpEndpointSection,
    PreviewSection,
    SandboxSection,
    ServerOptions,
    SessionsSection,
    ShutdownSection,
    TenantSection,
    Timeouts,
    TlsFiles,
    UidRange,
)
from dispatcher.config_base import HostPort, KeyProblem, Section, Text
from dispatcher.mcp.config import McpServers
from dispatcher.observe_config import MetricsSection, TracingSection

__all__ = ["ConfigFile", "config_schema"]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _factory_ref(value: str) -> str:
    if ":" not in value:
        raise ValueError(f"expected 'module:factory', got {value!r}")
    return value


def _null_is(empty: Any) -> BeforeValidator:
    return BeforeValidator(lambda v: empty if v is None else v)


FactoryRef = Annotated[str, Field(strict=True), AfterValidator(_factory_ref)]


class ShellToolSection(Section):
    """``tools.shell``: the built-in ``shell`` tool."""

    persist: Annotated[bool, Strict()] = True
    """Each shell command of a session starts in the directory and with the exported variables
    the previous one ended with (false: at the workspace root with the image's environment)."""


class RunCodeToolSection(Section):
    """``tools.run_code``: the built-in ``run_code`` tool's contexts (live interpreters)."""

    max_contexts: Annotated[int, Field(strict=True, ge=1, le=32)] = 4
    """Live contexts a session may have at once (a start past it is refused, naming them)."""
    idle_seconds: Annotated[float, Field(strict=True, gt=0, le=86400, allow_inf_nan=False)] = 1800.0
    """A context without a cell for this long ends (its variables with it)."""


class ToolsSection(Section):
    """``tools:``: custom tool factories, and settings of the built-in tools. A plain list is
    ``custom`` (the form before the built-in tools had settings)."""

    custom: Annotated[tuple[FactoryRef, ...], _null_is(())] = ()
    """Custom tool factories, ``module:callable`` (each call makes one fresh tool)."""
    shell: ShellToolSection = Field(default_factory=ShellToolSection)
    run_code: RunCodeToolSection = Field(default_factory=RunCodeToolSection)


def _tools_mapping(value: Any) -> Any:
    """A plain list is the custom factories; its bad items are named as the file has them
    (``tools[0]``, not ``tools.custom[0]``)."""
    if not isinstance(value, list | tuple):
        return value
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise KeyProblem(i, f"must be a string, got {item!r}")
        try:
            _factory_ref(item)
        except ValueError as exc:
            raise KeyProblem(i, str(exc)) from None
    return {"custom": value}


Tools = Annotated[
    ToolsSection,
    BeforeValidator(_tools_mapping, json_schema_input_type=ToolsSection | tuple[FactoryRef, ...] | None),
]


class ConfigFile(Section):
    """The server's YAML configuration file. Every key is optional; a section set to null keeps its
    defaults. Flags (--listen, --home) and the environment (DISPATCHER_LISTEN, DISPATCHER_HOME) win."""

    listen: HostPort = DEFAULT_LISTEN
    """HOST:PORT the gRPC server listens on."""
    home: Text = DEFAULT_HOME
    """The server's state directory: state.db, the token, audit log, quota images, workspaces."""
    log: LogSection = Field(default_factory=LogSection)
    server: ServerOptions = Field(default_factory=ServerOptions)
    tls: TlsFiles | None = None
    """Serve over TLS (plaintext without; fine on loopback only)."""
    dispatcher: DispatcherSection = Field(default_factory=DispatcherSection)
    dispatch: DispatchSection = Field(default_factory=DispatchSection)
    timeouts: Annotated[Timeouts, _null_is({})] = Field(default_factory=dict)
    """Per tool name, seconds (0 < t <= 86400); over the tool's own limit and the class defaults."""
    tool_confirmation: ToolConfirmation | None = None
    """What is asked before a call runs, by side-effect class and tool (README: Policy)."""
    sandbox: SandboxSection = Field(default_factory=SandboxSection)
    tools: Tools = Field(default_factory=ToolsSection)
    """Custom tool factories (``custom``, or a plain list of them) and the built-in tools'
    settings (``shell: {persist: true}``, ``run_code: {max_contexts: 4}``)."""
    mcp_servers: Annotated[McpServers, _null_is({})] = Field(default_factory=dict)
    """Stdio MCP servers whose tools are registered as ``mcp_<server>_<tool>``."""
    mcp_endpoint: McpEndpointSection | None = None
    """Serve MCP's streamable HTTP transport too (off without it)."""
    egress: EgressSection = Field(default_factory=EgressSection)
    """Which hosts sandboxes reach through the server's egress proxy (default: none); the default
    tenant's, and the base every ``tenants[].egress`` is laid over."""
    approval_modes: ApprovalModesOrNull = DEFAULT_APPROVAL_MODES
    """The approval modes sessions may choose (the first: what a session naming none gets), for the
    default tenant and every tenant without its own. ``autonomous`` and ``audit`` run calls the
    policy would ask about unasked, so they are allowed only when listed here or per tenant."""
    tenants: tuple[TenantSection, ...] | None = None
    """Without it: one tenant, ``default``, whose token is generated into ``<home>/token``."""
    tenant_uids: UidRange = Field(default_factory=UidRange)
    """Where tenants without a ``uid`` get theirs (with ``tenants:`` only)."""
    audit_log: Text | None = None
    """Path of the JSON-lines audit log (default: ``<home>/audit.jsonl``)."""
    shutdown: ShutdownSection = Field(default_factory=ShutdownSection)
    sessions: SessionsSection = Field(default_factory=SessionsSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    tracing: TracingSection = Field(default_factory=TracingSection)
    preview: PreviewSection = Field(default_factory=PreviewSection)
    """The preview gateway: sandbox ports as URLs for browsers (off unless ``listen``)."""


def config_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of the config file, as editors and CI linters take it."""
    schema = ConfigFile.model_json_schema(mode="validation")
    _closed_pattern_maps(schema)
    sections = {f"#/$defs/{name}" for name, d in schema["$defs"].items() if d.get("type") == "object"}
    _null_sections(schema, sections)
    return {"$schema": SCHEMA_DIALECT, **schema, "title": "dispatcher serve --config FILE"}


def _null_sections(node: Any, sections: set[str]) -> None:
    """A section may be given as null (its defaults), as the loader takes it: every plain
    reference to a section becomes "that section or null"."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict) and value.get("$ref") in sections:
                ref = value.pop("$ref")
                value["anyOf"] = [{"$ref": ref}, {"type": "null"}]
            elif key != "anyOf":  # an optional section already takes null
                _null_sections(value, sections)
    elif isinstance(node, list):
        for value in node:
            _null_sections(value, sections)


def _closed_pattern_maps(node: Any) -> None:
    """A map whose keys must match a pattern (server names, env names) takes no other key, as the
    loader does; pydantic leaves ``additionalProperties`` open there."""
    if isinstance(node, dict):
        if "patternProperties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _closed_pattern_maps(value)
    elif isinstance(node, list):
        for value in node:
            _closed_pattern_maps(value)
