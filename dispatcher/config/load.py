"""Reading the config file: YAML to the validated model, then the domain's types the server runs on.

The model (``ConfigFile``) checks each key on its own; what needs several keys or the machine is
checked here: the result budget fits the message limit, and (``tenants.py``) tenants' ids, tokens
and uids are their own and no workspace root holds another's or the server's state.
``TenantConfig`` and ``HOME_STATE`` are importable from here too.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from dispatcher.config import DEFAULT_HOME, DEFAULT_LISTEN, ENV_HOME, ENV_LISTEN, TOKEN_FILE, hash_token
from dispatcher.config.egress import egress_policy
from dispatcher.config.file import ConfigFile
from dispatcher.config.policy import DEFAULT_APPROVAL_MODES, CapabilitiesSection, ToolConfirmation
from dispatcher.config.salvage import salvage
from dispatcher.config.sections import (
    RESULT_MESSAGE_MARGIN,
    DispatcherSection,
    McpEndpointSection,
    PreviewSection,
    ServerOptions,
    SessionsSection,
    Timeouts,
    TlsFiles,
    UidRange,
)
from dispatcher.config.tenants import HOME_STATE, TenantConfig, check_workspace_roots, tenant_configs
from dispatcher.config_base import check_listen, validate_section
from dispatcher.core.approval.confirmation_policy import ConfirmationPolicy, PolicyLayer
from dispatcher.core.approval.modes import ApprovalMode
from dispatcher.core.call.ordering import Ordering
from dispatcher.core.call.settings import DispatcherConfig
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.errors import ConfigError
from dispatcher.egress.policy import EgressPolicy
from dispatcher.mcp import config as mcp_config
from dispatcher.mcp.config import McpServerConfig
from dispatcher.observe_config import ObserveConfig
from dispatcher.sandbox.container.config import SandboxConfig, WarmPoolConfig
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig

__all__ = [
    "DEFAULT_TENANT",
    "HOME_STATE",
    "Config",
    "TenantConfig",
    "ensure_default_tenant",
    "load_config",
    "parse_capabilities",
    "parse_policy",
    "parse_policy_layer",
    "parse_timeouts",
]

DEFAULT_TENANT = "default"
WRITE_INPUT_MARGIN = 64 << 10
"""What a write_file input needs besides its base64 content (the path, the keys, escapes)."""


@dataclass(frozen=True, slots=True)
class Config:
    """Everything ``dispatcher serve`` needs, validated."""

    listen: str = DEFAULT_LISTEN
    home: Path = field(default_factory=lambda: Path(DEFAULT_HOME).expanduser())
    log_format: Literal["json", "text"] = "json"
    log_level: str = "INFO"
    server: ServerOptions = field(default_factory=ServerOptions)
    dispatcher: DispatcherConfig = field(default_factory=DispatcherConfig)
    policy: ConfirmationPolicy = field(default_factory=ConfirmationPolicy)
    sandbox_backend: Literal["docker", "kubernetes", "local"] = "docker"
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """The container backends' config (its ``model_fields_set``: what the file set)."""
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    """``sandbox.kubernetes``: what the kubernetes backend adds."""
    custom_tools: tuple[str, ...] = ()
    shell_persist: bool = True
    """``tools.shell.persist``: a session's shell remembers its directory and exported variables."""
    code_contexts: int = 4
    """``tools.run_code.max_contexts``: live interpreters per session."""
    code_idle_seconds: float = 1800.0
    """``tools.run_code.idle_seconds``: an interpreter without a cell this long ends."""
    mcp_servers: tuple[McpServerConfig, ...] = ()
    """Stdio MCP servers whose tools are registered as ``mcp_<server>_<tool>`` (see dispatcher.mcp.config)."""
    tenants: tuple[TenantConfig, ...] = ()
    """Empty until ``ensure_default_tenant``; the file's tenants otherwise."""
    tenant_uids: UidRange | None = None
    """Set with a ``tenants:`` list: each tenant without ``uid:`` gets its own from this range.
    None (the single default tenant): sandboxes run as ``sandbox.user``."""
    audit_log: Path | None = None
    shutdown_remove_sessions: bool = False
    """``shutdown: {remove_sessions: true}``: a graceful stop closes every session (removing its
    container and its stored state) instead of keeping them for the next start."""
    tls: TlsFiles | None = None
    """None: plaintext (fine on loopback; use TLS for anything else)."""
    mcp_endpoint: McpEndpointSection | None = None
    """``mcp_endpoint:``: the streamable HTTP MCP endpoint; None: not served."""
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    """``metrics:`` and ``tracing:`` (dispatcher/observe_config.py)."""
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    """The top-level ``egress:``: the default tenant's."""
    sessions: SessionsSection = field(default_factory=SessionsSection)
    """``sessions:``: their clocks' defaults (``core/sessions/expiry.py``)."""
    approval_modes: tuple[ApprovalMode, ...] = DEFAULT_APPROVAL_MODES
    """The top-level ``approval_modes``: the default tenant's, and every tenant's without its own."""
    preview: PreviewSection = field(default_factory=PreviewSection)
    """``preview:``: the gateway to sandbox ports (``server/preview/``)."""
    source: Path | None = None

    @property
    def token_path(self) -> Path:
        return self.home / TOKEN_FILE


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    listen: str | None = None,
    home: str | None = None,
    env: Mapping[str, str] | None = None,
    problems: list[str] | None = None,
) -> Config:
    """Read and validate the YAML file (if any) and apply env and flag overrides.

    ``problems``: the checks across keys append to it instead of raising (``config-check`` goes on
    to report the rest of what ``serve`` checks in the same run).

    Raises:
        ConfigError: naming the offending key; also for an unreadable file or bad YAML.
    """
    env = os.environ if env is None else env
    data: Mapping[str, Any] = {}
    source: Path | None = None
    if path is not None:
        source = Path(path).expanduser()
        try:
            loaded = yaml.safe_load(source.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read config: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: invalid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, Mapping):
            raise ConfigError(f"{source}: the top level must be a mapping")
        data = loaded or {}
    return _build(data, source=source, listen=listen, home=home, env=env, problems=problems)


def _build(
    data: Mapping[str, Any],
    *,
    source: Path | None,
    listen: str | None,
    home: str | None,
    env: Mapping[str, str],
    problems: list[str] | None = None,
) -> Config:
    try:
        file: ConfigFile = validate_section(ConfigFile, data, "")
    except ConfigError as exc:
        # config-check goes on without the keys that failed (salvage.py), so the checks that need
        # a whole config (the tool names) report in this same run. Only these lines are the
        # file's: the checks across keys ran on a file that is not the user's, and stay silent.
        salvaged = salvage(ConfigFile, data) if problems is not None else None
        if problems is None or salvaged is None:
            raise
        try:
            config = _from_file(salvaged, source=source, listen=listen, home=home, env=env, problems=[])
        except ConfigError:
            raise exc from None
        problems.extend(str(exc).splitlines())
        return config
    return _from_file(file, source=source, listen=listen, home=home, env=env, problems=problems)


def _from_file(
    file: ConfigFile,
    *,
    source: Path | None,
    listen: str | None,
    home: str | None,
    env: Mapping[str, str],
    problems: list[str] | None,
) -> Config:
    listen_addr = check_listen(listen or env.get(ENV_LISTEN) or file.listen, "listen")
    home_dir = Path(home or env.get(ENV_HOME) or file.home).expanduser().absolute()
    found: list[str] = []  # every check across keys runs: one run reports every mistake
    tenants = tenant_configs(file.tenants or (), home_dir, file.egress, file.approval_modes, found)
    audit_path = Path(file.audit_log).expanduser() if file.audit_log else home_dir / "audit.jsonl"
    check_workspace_roots(tenants, home_dir, audit_path, found)
    tool_confirmation = file.tool_confirmation.layer() if file.tool_confirmation else None
    dispatcher = _dispatcher_config(
        file.dispatcher, file.server, file.timeouts, file.dispatch.ordering, found
    )
    if file.mcp_endpoint is not None and file.tls is not None:
        found.append(
            "mcp_endpoint: not served with tls (its gateway is a plaintext gRPC client of this "
            "server); put the MCP endpoint behind a TLS proxy, or run `dispatcher mcp` per host"
        )
    if found and problems is None:
        raise ConfigError("\n".join(found))
    if problems is not None:
        problems.extend(found)
    return Config(
        listen=listen_addr,
        home=home_dir,
        log_format=file.log.format,
        log_level=file.log.level,
        server=file.server,
        dispatcher=dispatcher,
        policy=ConfirmationPolicy().merged(tool_confirmation),
        sandbox_backend=file.sandbox.backend,
        sandbox=_embedded_pool(file.sandbox.container(), source),
        kubernetes=file.sandbox.cluster(),
        custom_tools=file.tools.custom,
        shell_persist=file.tools.shell.persist,
        code_contexts=file.tools.run_code.max_contexts,
        code_idle_seconds=file.tools.run_code.idle_seconds,
        mcp_servers=mcp_config.named(file.mcp_servers),
        tenants=tenants,
        tenant_uids=file.tenant_uids if tenants else None,
        audit_log=audit_path,
        tls=file.tls,
        mcp_endpoint=file.mcp_endpoint,
        shutdown_remove_sessions=file.shutdown.remove_sessions,
        observe=ObserveConfig.of(file.metrics, file.tracing),
        egress=egress_policy(file.egress),
        sessions=file.sessions,
        approval_modes=file.approval_modes,
        preview=_embedded_preview(file.preview, source),
        source=source,
    )


EMBEDDED_WARM_POOL = 2
"""``sandbox.warm_pool.size`` of a server started without a config file (``make serve``): a
developer's first sessions adopt a ready container. A config file's default stays 0."""


def _embedded_pool(sandbox: SandboxConfig, source: Path | None) -> SandboxConfig:
    if source is not None:
        return sandbox
    return sandbox.model_copy(update={"warm_pool": WarmPoolConfig(size=EMBEDDED_WARM_POOL)})


EMBEDDED_PREVIEW_LISTEN = "127.0.0.1:50080"
"""``preview.listen`` of a server started without a config file (``make serve``): a developer's
previews open at ``http://{port}-{session}.localhost:50080/`` (browsers resolve ``*.localhost``)."""


def _embedded_preview(preview: PreviewSection, source: Path | None) -> PreviewSection:
    if source is not None or preview.listen is not None:
        return preview
    return preview.model_copy(update={"listen": EMBEDDED_PREVIEW_LISTEN})


def ensure_default_tenant(config: Config) -> tuple[Config, str | None]:
    """With no tenants configured, add ``default`` with the token in ``<home>/token`` (made if missing).

    Returns the config to serve and the freshly generated token, if one was written.
    """
    if config.tenants:
        return config, None
    config.home.mkdir(parents=True, exist_ok=True, mode=0o700)
    token_path = config.token_path
    generated: str | None = None
    if token_path.exists():
        token = token_path.read_text(encoding="utf-8").strip()
        if not token:
            raise ConfigError(f"{token_path}: empty token file (delete it to generate a new one)")
    else:
        token = generated = secrets.token_urlsafe(32)
        fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
    tenant = TenantConfig(
        DEFAULT_TENANT,
        (hash_token(token),),
        config.home / "workspaces",
        capabilities=Capabilities(egress_allow=config.egress.allow),
        egress=config.egress,
        approval_modes=config.approval_modes,
    )
    return dataclasses.replace(config, tenants=(tenant,)), generated


def parse_policy(section: Any, *, where: str = "tool_confirmation") -> ConfirmationPolicy:
    """A ``tool_confirmation:`` section laid over the cautious defaults.

    Raises:
        ConfigError: naming the offending key.
    """
    return ConfirmationPolicy().merged(parse_policy_layer(section, where=where))


def parse_policy_layer(section: Any, *, where: str = "tool_confirmation") -> PolicyLayer:
    """A ``tool_confirmation:`` section as the layer it lays over a policy.

    Raises:
        ConfigError: naming the offending key.
    """
    confirmation: ToolConfirmation = validate_section(ToolConfirmation, section, where)
    return confirmation.layer()


def parse_capabilities(section: Any, *, where: str = "capabilities") -> Capabilities:
    """``{tools: [...], fs: [{path, mode}]}``.

    Raises:
        ConfigError: naming the offending key.
    """
    caps: CapabilitiesSection = validate_section(CapabilitiesSection, section, where)
    return caps.capabilities()


def parse_timeouts(section: Any, *, where: str = "timeouts") -> dict[str, float]:
    """The ``timeouts:`` map: tool name -> seconds, each in (0, ``MAX_TIMEOUT_SECONDS``].

    Raises:
        ConfigError: naming the offending entry.
    """
    if section is None:
        return {}
    timeouts: dict[str, float] = validate_section(Timeouts, section, where)
    return timeouts


def _dispatcher_config(
    section: DispatcherSection,
    server: ServerOptions,
    timeouts: Mapping[str, float],
    ordering: Ordering,
    problems: list[str],
) -> DispatcherConfig:
    """The ``dispatcher:`` section, its byte limits fitted into one another: a result into
    ``server.max_message_bytes``, a tool input into ``server.max_request_bytes``, a write_file's
    content (as base64) into a tool input. A limit the file leaves out comes down with a smaller
    one; a limit it sets that does not fit is an error.

    A key that does not fit is a line in ``problems`` naming it and what it must fit.
    """
    given = section.model_fields_set
    room = server.max_message_bytes - RESULT_MESSAGE_MARGIN
    if "result_budget_bytes" in given and section.result_budget_bytes > room:
        problems.append(
            f"dispatcher.result_budget_bytes: {section.result_budget_bytes} leaves no room in "
            f"server.max_message_bytes ({server.max_message_bytes}); at most {room}"
        )
    input_room = server.max_request_bytes - RESULT_MESSAGE_MARGIN
    if "max_input_bytes" in given and section.max_input_bytes > input_room:
        problems.append(
            f"dispatcher.max_input_bytes: {section.max_input_bytes} leaves no room in "
            f"server.max_request_bytes ({server.max_request_bytes}); at most {input_room}"
        )
    max_input = max(min(section.max_input_bytes, input_room), 1)
    write_room = max((max_input - WRITE_INPUT_MARGIN) // 4 * 3, 1)  # base64: 4 characters per 3 bytes
    if "max_write_bytes" in given and section.max_write_bytes > write_room:
        problems.append(
            f"dispatcher.max_write_bytes: {section.max_write_bytes} as base64 does not fit "
            f"dispatcher.max_input_bytes ({max_input}); at most {write_room}"
        )
    return DispatcherConfig(
        **{
            **section.model_dump(),
            "result_budget_bytes": max(min(section.result_budget_bytes, room), 1),
            "max_input_bytes": max_input,
            "max_write_bytes": min(section.max_write_bytes, write_room),
            "timeouts": dict(timeouts),
            "ordering": ordering,
        }
    )
