"""What ``serve`` checks of its config before it starts, and ``config-check`` runs the same: the
tool registry built (built-in and custom tools), every key that names a tool naming one, and (with
``--images``) the sandbox image's preflight. Every problem is reported at once, one per line, each
naming its key, so a file is fixed in one pass.

MCP servers' tools are known only once their servers run (``serve`` starts them; ``config-check``
does not): before that a name ``mcp_<server>_<tool>`` of a configured server is accepted, and
``serve`` checks it again once the servers have listed their tools (``check_tool_names`` with the
registry complete). A name with no configured server's prefix is an error at once.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from dispatcher.config.load import Config
from dispatcher.core.approval.confirmation_policy import Mode
from dispatcher.core.errors import ConfigError, ToolRegistrationError
from dispatcher.core.provider_api import SandboxProvider
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.core.types import ToolFactory
from dispatcher.server.sessions.egress import EGRESS_TOOL  # a policy may name the egress questions

__all__ = [
    "check_images",
    "check_served_config",
    "check_tool_names",
    "load_tool_factory",
    "register_tools",
]

_SHOWN_NAMES = 40


class Registry(Protocol):
    def register(self, factory: ToolFactory, *, builtin: bool = False) -> Any: ...

    def list(self) -> list[str]: ...


def load_tool_factory(spec: str, where: str = "tools") -> ToolFactory:
    """Import ``module:factory`` (the factory makes one fresh Tool per call).

    Raises:
        ConfigError: naming the entry (``where``), when it cannot be imported or is not callable.
    """
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:  # ImportError, AttributeError, or whatever the module raised on import
        raise ConfigError(f"{where}: cannot load {spec!r}: {exc!r}") from exc
    if not callable(target):
        raise ConfigError(f"{where}: {spec!r} is not callable")
    factory: ToolFactory = target
    return factory


def register_tools(config: Config, registry: Registry) -> list[str]:
    """Register the built-in tools and the config's custom tools; the custom tools that cannot be
    loaded or registered are returned as problems, each naming its ``tools[i]``."""
    from dispatcher.tools import builtin_factories

    built_in = builtin_factories(
        max_write_bytes=config.dispatcher.max_write_bytes,
        shell_persist=config.shell_persist,
        code_contexts=config.code_contexts,
        code_idle_seconds=config.code_idle_seconds,
    )
    for factory in built_in:
        registry.register(factory, builtin=True)
    problems = []
    for i, spec in enumerate(config.custom_tools):
        where = f"tools[{i}]"
        try:
            registry.register(load_tool_factory(spec, where))
        except ConfigError as exc:
            problems.append(str(exc))
        except ToolRegistrationError as exc:  # duplicate or built-in name, schema outside the subset
            problems.append(f"{where}: {spec!r}: {exc}")
    return problems


def check_served_config(config: Config, registry: Registry) -> None:
    """The check ``serve`` runs before it starts, and ``config-check`` with it: the tools
    registered into ``registry``, then every key naming a tool checked against them (MCP tools of
    configured servers accepted until their servers run).

    Raises:
        ConfigError: every problem, one per line, each naming its key.
    """
    problems = register_tools(config, registry)
    problems += check_tool_names(config, registry.list(), mcp_pending=True)
    if problems:
        raise ConfigError("\n".join(problems))


def check_tool_names(config: Config, names: Iterable[str], *, mcp_pending: bool) -> list[str]:
    """Each key that names a tool names a known one: ``timeouts``, ``tool_confirmation``'s
    ``per_tool``, ``always_prompt`` and ``modes.<mode>.per_tool`` (top level and per tenant, where
    ``egress`` names the egress questions), and ``tenants[i].tools``. ``mcp_pending``: MCP servers
    have not listed their tools yet, so a name under a configured server's prefix is accepted."""
    known = set(names)
    prefixes = tuple(f"mcp_{server.name}_" for server in config.mcp_servers) if mcp_pending else ()
    problems: list[str] = []

    def check(where: str, named: Iterable[str], *, policy: bool = False) -> None:
        for name in sorted(set(named)):
            if name in known or name.startswith(prefixes) or (policy and name == EGRESS_TOOL):
                continue
            problems.append(f"{where}: no tool named {name!r} (known: {_known(known, prefixes)})")

    check("timeouts", config.dispatcher.timeouts)
    policy = config.policy
    _check_policy(check, "tool_confirmation", policy.per_tool, policy.always_prompt, policy.modes)
    for i, tenant in enumerate(config.tenants):
        if tenant.capabilities.allowed_tools is not None:
            check(f"tenants[{i}].tools", tenant.capabilities.allowed_tools)
        layer = tenant.policy_overrides
        if layer is not None:
            where = f"tenants[{i}].tool_confirmation"
            _check_policy(check, where, layer.per_tool, layer.always_prompt, layer.modes)
    return problems


def _check_policy(
    check: Any,
    where: str,
    per_tool: Mapping[str, Mode],
    always_prompt: Iterable[str],
    modes: Mapping[str, Mapping[str, Mode]],
) -> None:
    check(f"{where}.per_tool", per_tool, policy=True)
    check(f"{where}.always_prompt", always_prompt, policy=True)
    for mode, overrides in sorted(modes.items()):
        check(f"{where}.modes.{mode}.per_tool", overrides, policy=True)


def _known(known: set[str], prefixes: tuple[str, ...]) -> str:
    shown = sorted(known)[:_SHOWN_NAMES]
    more = len(known) - len(shown)
    text = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    if prefixes:
        text += "; and the tools of MCP servers: " + ", ".join(f"{p}<tool>" for p in prefixes)
    return text


async def check_images(config: Config, provider: SandboxProvider) -> list[str]:
    """``serve``'s sandbox preflight (``provider.check_ready``: the daemon answers, the image
    exists and has python, the agent of this protocol version and a non-root USER); its refusal
    as a problem naming ``sandbox.image``."""
    try:
        await provider.check_ready()
    except SandboxError as exc:
        return [f"sandbox.image: {exc}"]
    return []
