"""The server's one YAML configuration file, its embedded defaults and its overrides.

Precedence, highest first: command-line flags (``--listen``, ``--home``), the environment
(``DISPATCHER_LISTEN``, ``DISPATCHER_HOME``), the file, then the embedded defaults. Everything is
validated when the server starts; every error names the offending key (``tenants[1].quotas.max_sessions:
...``). Sections that belong to other layers are validated by their owners: ``tool_confirmation:`` by
``ConfirmationPolicy.from_config`` and ``sandbox:`` by ``SandboxConfig.from_mapping``.

Example::

    listen: 127.0.0.1:50051
    home: ~/.dispatcher
    log: {format: json, level: info}
    server: {max_message_bytes: 4194304, grace_seconds: 10}
    # UploadFiles / DownloadFiles per request: archive bytes, entries, downloaded content bytes
    # server: {max_upload_bytes: 1073741824, max_upload_files: 100000, max_download_bytes: 1073741824}
    tls: {cert_file: server.pem, key_file: server.key}   # optional; client_ca_file for mutual TLS
    shutdown: {remove_sessions: false}   # true: a graceful stop closes every session (default: kept)
    metrics: {listen: 127.0.0.1:9464}    # Prometheus /metrics (off by default; --metrics-listen)
    tracing: {otlp_endpoint: http://127.0.0.1:4317}   # OTLP spans; needs dispatcher[otel]
    dispatcher: {concurrency: 4, confirmation_timeout: 300, max_write_bytes: 4128768}
    # default_timeout: 60 (NONE/READ/WRITE tools), execute_timeout: 600 (EXECUTE/NETWORK, shell)
    timeouts: {shell: 1800, read_file: 10}         # per tool, seconds (0 < t <= 86400)
    tool_confirmation:            # exactly spec 000's structure
      default: {WRITE: prompt, EXECUTE: prompt}
      per_tool: {git_status: auto}
    sandbox: {backend: docker, image: dispatcher-sandbox:latest}
    tools: ["mypkg.tools:make_grep_tool"]          # custom tool factories, module:callable
    mcp_servers:                                   # stdio MCP servers: tools mcp_<server>_<tool>
      notes: {command: notes-mcp, run: host, side_effect: read}   # see dispatcher/mcp/config.py
    tenants:
      - id: acme
        token_sha256: [9f86d0...]                  # sha256 hex of each bearer token
        workspace_root: /srv/dispatcher/acme       # relative: under home (default: home/workspaces/<id>)
        tools: [read_file, list_dir, shell]        # allow-list (omit: every tool)
        fs: [{path: src, mode: rw}, {path: ., mode: r}]
        tool_confirmation: {default: {EXECUTE: deny}}   # laid over the server's policy
        quotas: {max_sessions: 20, max_concurrent_dispatches: 8, max_watch_streams: 8}
        uid: 200500                                # host uid of its sandboxes (omit: allocated)
        gid: 200500                                # host gid (omit: the uid)
        approval_modes: [cautious, review, manual] # modes its sessions may choose (omit: all)
    tenant_uids: {start: 200000, count: 100000}    # where tenants without a uid get theirs

Memory is bounded per session and per tenant, in bytes. Defaults: ``quotas: {max_sessions: 100,
max_concurrent_dispatches: 32, max_watch_streams: 32}`` per tenant; per session, at most
``dispatcher.event_history_bytes`` (8 MiB) and 10,000 events of replay history; per Dispatch, at
most 128 tool_uses and 16 MiB of results the client has not read yet (further tool_uses start as
it reads); per result, ``dispatcher.result_budget_bytes`` (images included; default and ceiling:
``server.max_message_bytes`` less 64 KiB), past which the result is cut or, for an image, becomes
an error result for that tool_use alone. Ids, ``turn_id``, tool names and ``request_id`` are at
most 256 characters (longer is INVALID_ARGUMENT).

Without ``tenants:`` there is one tenant, ``default``, whose token is generated on first start
and written to ``<home>/token`` (mode 0600); its workspaces live under ``<home>/workspaces``, and
its sandboxes run as the owner of that directory (so a developer's files stay theirs), as
``sandbox.user`` when the file sets it, and as 1000:1000 when the owner is root (never as root).

With ``tenants:``, every tenant's sandboxes run as that tenant's own host uid and gid, so the
kernel's per-user limits (inotify instances and watches, processes, keys) are the tenant's alone:
``uid:``/``gid:`` when given (distinct per tenant, never 0), else a uid allocated from
``tenant_uids`` on first start (gid = uid), first come first served, and kept in
``<home>/uids.json`` so it survives restarts and reorderings and is never reused for another tenant.
Files a sandbox writes in a tenant's workspaces belong to that uid. A host user reads them as root,
through an ACL (``setfacl -R -m u:alice:rX -m d:u:alice:rX <workspace_root>``; the default entry
covers files made later), or through a group: give the tenant ``gid:`` of a host group the user is
in (files are made group-readable under the usual umask 022).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from dispatcher.core.approval import ApprovalMode
from dispatcher.core.capabilities import Capabilities
from dispatcher.core.errors import ConfigError
from dispatcher.core.policy import ConfirmationPolicy
from dispatcher.core.settings import DispatcherConfig
from dispatcher.core.timeouts import parse_timeouts
from dispatcher.mcp.config import McpServerConfig, parse_mcp_servers
from dispatcher.observe_config import ObserveConfig, parse_observe

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_HOME = "~/.dispatcher"
DEFAULT_TENANT = "default"
ENV_LISTEN = "DISPATCHER_LISTEN"
ENV_HOME = "DISPATCHER_HOME"
ENV_TOKEN = "DISPATCHER_TOKEN"
ENV_TLS_CA = "DISPATCHER_TLS_CA"
TOKEN_FILE = "token"

_TOP_KEYS = frozenset(
    {
        "listen",
        "home",
        "log",
        "server",
        "tls",
        "dispatcher",
        "tool_confirmation",
        "sandbox",
        "tools",
        "tenants",
        "tenant_uids",
        "audit_log",
        "shutdown",
        "mcp_servers",
        "timeouts",
        "metrics",
        "tracing",
    }
)
_TENANT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
RESULT_MESSAGE_MARGIN = 64 << 10  # what a result message needs besides its budgeted bytes
MAX_ID = 0xFFFFFFFE  # (uid_t)-1 means "leave unchanged" to chown; every id below it is real
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Transport knobs of the gRPC server."""

    max_message_bytes: int = 4 << 20
    """Largest request or response message; a bigger request is RESOURCE_EXHAUSTED."""
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    grace_seconds: float = 10.0
    """On SIGTERM: how long in-flight calls may finish before they are cancelled."""
    max_concurrent_streams: int = 1000
    max_upload_bytes: int = 1 << 30
    """Bytes of tar archive one UploadFiles may send; more is RESOURCE_EXHAUSTED, nothing written."""
    max_upload_files: int = 100_000
    """Files and directories in one UploadFiles."""
    max_download_bytes: int = 1 << 30
    """Bytes of file content one DownloadFiles may carry; more is RESOURCE_EXHAUSTED."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for serving over TLS; with ``client_ca_file`` clients must present a certificate."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


@dataclass(frozen=True, slots=True)
class Quotas:
    """Per-tenant limits (a request past one is RESOURCE_EXHAUSTED); ``None`` is unlimited."""

    max_sessions: int | None = 100
    """Open sessions. Each keeps at most ``dispatcher.event_history_bytes`` of event history, so a
    tenant's history is bounded by ``max_sessions`` x that (800 MiB with the defaults)."""
    max_concurrent_dispatches: int | None = 32
    """Dispatch streams running at once. Each holds at most ``PENDING_RESULT_BYTES`` of results its
    client has not read (plus one result in flight), so that memory is bounded per tenant too."""
    max_watch_streams: int | None = 32
    """WatchSession streams open at once."""


@dataclass(frozen=True, slots=True)
class UidRange:
    """``tenant_uids: {start, count}``: where tenants without an explicit ``uid`` get theirs."""

    start: int = 200_000
    count: int = 100_000

    def __post_init__(self) -> None:
        if self.start < 1:
            raise ConfigError(f"tenant_uids.start: must be at least 1 (never root), got {self.start}")
        if self.count < 1 or self.start + self.count - 1 > MAX_ID:
            raise ConfigError(f"tenant_uids.count: must be positive and end at most at {MAX_ID}")

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.start <= uid < self.start + self.count


@dataclass(frozen=True, slots=True)
class TenantConfig:
    """One tenant: who it is (token hashes), where its workspaces live and what it may do."""

    tenant_id: str
    token_sha256: tuple[str, ...]
    workspace_root: Path
    capabilities: Capabilities = field(default_factory=Capabilities)
    policy_overrides: Mapping[str, Any] | None = None
    quotas: Quotas = field(default_factory=Quotas)
    uid: int | None = None
    """Host uid of the tenant's sandboxes; None: allocated from ``Config.tenant_uids`` (if set)."""
    gid: int | None = None
    """Host gid; None: the uid."""
    approval_modes: tuple[ApprovalMode, ...] = tuple(ApprovalMode)
    """The approval modes its sessions may choose; the first is what a session that names none gets."""


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
    sandbox_backend: Literal["docker", "local"] = "docker"
    sandbox: Mapping[str, Any] = field(default_factory=dict)
    """The ``sandbox:`` section less ``backend``, for the backend's own config class."""
    custom_tools: tuple[str, ...] = ()
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
    observe: ObserveConfig = field(default_factory=ObserveConfig)
    """``metrics:`` and ``tracing:`` (dispatcher/observe_config.py)."""
    source: Path | None = None

    @property
    def token_path(self) -> Path:
        return self.home / TOKEN_FILE


def hash_token(token: str) -> str:
    """The sha256 hex digest stored in the config instead of the token itself."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    listen: str | None = None,
    home: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Read and validate the YAML file (if any) and apply env and flag overrides.

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
    return _build(data, source=source, listen=listen, home=home, env=env)


def _build(
    data: Mapping[str, Any],
    *,
    source: Path | None,
    listen: str | None,
    home: str | None,
    env: Mapping[str, str],
) -> Config:
    _no_unknown(data, _TOP_KEYS, "")
    listen_addr = listen or env.get(ENV_LISTEN) or _str(data, "listen", "", DEFAULT_LISTEN)
    _check_listen(listen_addr)
    home_dir = Path(home or env.get(ENV_HOME) or _str(data, "home", "", DEFAULT_HOME)).expanduser().absolute()
    log = _section(data, "log", "")
    _no_unknown(log, {"format", "level"}, "log")
    log_format = _str(log, "format", "log", "json")
    if log_format not in ("json", "text"):
        raise ConfigError(f"log.format: must be 'json' or 'text', got {log_format!r}")
    log_level = _str(log, "level", "log", "INFO").upper()
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"log.level: must be one of debug, info, warning, error, got {log_level!r}")
    sandbox = dict(_section(data, "sandbox", ""))
    backend = sandbox.pop("backend", "docker")
    if backend not in ("docker", "local"):
        raise ConfigError(f"sandbox.backend: must be 'docker' or 'local', got {backend!r}")
    _check_sandbox(backend, sandbox)
    tools = data.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, str) and ":" in t for t in tools):
        raise ConfigError("tools: must be a list of 'module:factory' strings")
    audit = data.get("audit_log")
    if audit is not None and not isinstance(audit, str):
        raise ConfigError("audit_log: must be a path")
    tenants = _tenants(data.get("tenants"), home_dir)
    uid_range = _uid_range(data)
    audit_path = Path(audit).expanduser() if audit else home_dir / "audit.jsonl"
    _check_workspace_roots(tenants, home_dir, audit_path)
    return Config(
        listen=listen_addr,
        home=home_dir,
        log_format=log_format,  # type: ignore[arg-type]  # checked above
        log_level=log_level,
        server=_dataclass_section(ServerOptions, _section(data, "server", ""), "server"),
        dispatcher=_dispatcher_config(data),
        policy=ConfirmationPolicy.from_config(data.get("tool_confirmation")),
        sandbox_backend=backend,
        sandbox=sandbox,
        custom_tools=tuple(tools),
        mcp_servers=parse_mcp_servers(data.get("mcp_servers")),
        tenants=tenants,
        tenant_uids=uid_range if tenants else None,
        audit_log=audit_path,
        tls=_tls(data.get("tls")),
        shutdown_remove_sessions=_shutdown(data),
        observe=parse_observe(data),
        source=source,
    )


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
    tenant = TenantConfig(DEFAULT_TENANT, (hash_token(token),), config.home / "workspaces")
    return dataclasses.replace(config, tenants=(tenant,)), generated


def client_token(home: str | None = None, env: Mapping[str, str] | None = None) -> str | None:
    """The token a client on this machine uses: ``DISPATCHER_TOKEN``, else ``<home>/token``."""
    env = os.environ if env is None else env
    if env.get(ENV_TOKEN):
        return env[ENV_TOKEN].strip()
    base = Path(home or env.get(ENV_HOME) or DEFAULT_HOME).expanduser()
    try:
        return (base / TOKEN_FILE).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def default_target(env: Mapping[str, str] | None = None) -> str:
    """Where clients connect by default: the server's default listen address."""
    env = os.environ if env is None else env
    return env.get(ENV_LISTEN) or DEFAULT_LISTEN


def _tenants(value: Any, home: Path) -> tuple[TenantConfig, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError("tenants: must be a list of tenants")
    seen_ids: set[str] = set()
    seen_hashes: set[str] = set()
    seen_uids: dict[int, str] = {}
    out: list[TenantConfig] = []
    for i, item in enumerate(value):
        where = f"tenants[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{where}: must be a mapping")
        _no_unknown(
            item,
            {
                "id",
                "token_sha256",
                "workspace_root",
                "tools",
                "fs",
                "tool_confirmation",
                "quotas",
                "uid",
                "gid",
                "approval_modes",
            },
            where,
        )
        tenant_id = item.get("id")
        if not isinstance(tenant_id, str) or not _TENANT_ID_RE.match(tenant_id):
            raise ConfigError(f"{where}.id: must match {_TENANT_ID_RE.pattern}")
        if tenant_id in seen_ids:
            raise ConfigError(f"{where}.id: duplicate tenant id {tenant_id!r}")
        seen_ids.add(tenant_id)
        hashes = item.get("token_sha256")
        if isinstance(hashes, str):
            hashes = [hashes]
        if not isinstance(hashes, list) or not hashes:
            raise ConfigError(f"{where}.token_sha256: must be a sha256 hex digest or a list of them")
        for h in hashes:
            if not isinstance(h, str) or not _SHA256_RE.match(h.lower()):
                raise ConfigError(f"{where}.token_sha256: {h!r} is not a sha256 hex digest")
            if h.lower() in seen_hashes:
                raise ConfigError(f"{where}.token_sha256: token already belongs to another tenant")
            seen_hashes.add(h.lower())
        root = item.get("workspace_root")
        if root is not None and not isinstance(root, str):
            raise ConfigError(f"{where}.workspace_root: must be a path")
        # A relative root is under the server's home, never under whatever directory it started in.
        root_path = home / Path(root).expanduser() if root else home / "workspaces" / tenant_id
        overrides = item.get("tool_confirmation")
        if overrides is not None:
            ConfirmationPolicy().merged(overrides, where=f"{where}.tool_confirmation")  # validate now
        caps = {k: item[k] for k in ("tools", "fs") if k in item}
        quotas = _section(item, "quotas", where)
        uid, gid = _id(item, "uid", where), _id(item, "gid", where)
        if gid is not None and uid is None:
            raise ConfigError(f"{where}.gid: needs a uid as well")
        if uid is not None and uid in seen_uids:
            raise ConfigError(f"{where}.uid: {uid} belongs to tenant {seen_uids[uid]!r}; tenants never share")
        if uid is not None:
            seen_uids[uid] = tenant_id
        out.append(
            TenantConfig(
                tenant_id=tenant_id,
                token_sha256=tuple(h.lower() for h in hashes),
                workspace_root=root_path,
                capabilities=Capabilities.from_config(caps, where=where),
                policy_overrides=overrides,
                quotas=_dataclass_section(Quotas, quotas, f"{where}.quotas"),
                uid=uid,
                gid=gid if gid is not None else uid,
                approval_modes=_approval_modes(item.get("approval_modes"), f"{where}.approval_modes"),
            )
        )
    return tuple(out)


def _approval_modes(value: Any, where: str) -> tuple[ApprovalMode, ...]:
    """A tenant's ``approval_modes:`` list (absent: every mode, cautious first)."""
    if value is None:
        return tuple(ApprovalMode)
    names = [m.value for m in ApprovalMode]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: must be a non-empty list of modes from {names}")
    modes: list[ApprovalMode] = []
    for v in value:
        if v not in names:
            raise ConfigError(f"{where}: unknown approval mode {v!r} (one of {names})")
        if ApprovalMode(v) in modes:
            raise ConfigError(f"{where}: {v!r} is listed twice")
        modes.append(ApprovalMode(v))
    return tuple(modes)


def _id(item: Mapping[str, Any], key: str, where: str) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 < value <= MAX_ID:
        raise ConfigError(f"{where}.{key}: must be a number from 1 to {MAX_ID} (never root), got {value!r}")
    return value


def _uid_range(data: Mapping[str, Any]) -> UidRange:
    section = _section(data, "tenant_uids", "")
    _no_unknown(section, {"start", "count"}, "tenant_uids")
    for key, value in section.items():
        if type(value) is not int:
            raise ConfigError(f"tenant_uids.{key}: expected an integer, got {value!r}")
    return UidRange(**section)


HOME_STATE = ("run", "volumes", TOKEN_FILE, "state.db", "audit.jsonl", "uids.json", "server.lock")
"""What the server keeps in its home besides workspaces; no tenant root may hold or be inside it."""


def _check_workspace_roots(tenants: tuple[TenantConfig, ...], home: Path, audit: Path) -> None:
    """A tenant's sandboxes write under its root: no root may hold another's, or the server's state.

    Raises:
        ConfigError: naming the tenant's ``workspace_root``.
    """
    real_home = Path(os.path.realpath(home))
    state = [real_home / name for name in HOME_STATE] + [Path(os.path.realpath(audit))]
    roots = [Path(os.path.realpath(t.workspace_root)) for t in tenants]
    for i, root in enumerate(roots):
        where = f"tenants[{i}].workspace_root"
        if real_home.is_relative_to(root):
            raise ConfigError(
                f"{where}: {root} holds the server's home {real_home}; use a directory of its own"
            )
        for path in state:
            if path.is_relative_to(root) or root.is_relative_to(path):
                raise ConfigError(
                    f"{where}: {root} overlaps the server's state {path}; use another directory"
                )
        for j, other_root in enumerate(roots):
            if j != i and root.is_relative_to(other_root):
                raise ConfigError(
                    f"{where}: {root} is inside (or equal to) tenant {tenants[j].tenant_id!r}'s workspace"
                    f" root {other_root}; every tenant needs a root of its own, apart from the others"
                )


def _dispatcher_config(data: Mapping[str, Any]) -> DispatcherConfig:
    """The ``dispatcher:`` section, with the result byte budget fitted to the message limit.

    Raises:
        ConfigError: ``result_budget_bytes`` does not leave room in ``server.max_message_bytes``.
    """
    section = _section(data, "dispatcher", "")
    config = _dataclass_section(DispatcherConfig, section, "dispatcher")
    server = _dataclass_section(ServerOptions, _section(data, "server", ""), "server")
    room = server.max_message_bytes - RESULT_MESSAGE_MARGIN
    if "result_budget_bytes" in section and config.result_budget_bytes > room:
        raise ConfigError(
            f"dispatcher.result_budget_bytes: {config.result_budget_bytes} leaves no room in "
            f"server.max_message_bytes ({server.max_message_bytes}); at most {room}"
        )
    if config.result_budget_bytes > room:  # a smaller message limit takes the default budget down
        config = dataclasses.replace(config, result_budget_bytes=max(room, 1))
    if "max_write_bytes" in section and not 0 < config.max_write_bytes <= room:
        raise ConfigError(
            f"dispatcher.max_write_bytes: {config.max_write_bytes} must be positive and fit in "
            f"server.max_message_bytes ({server.max_message_bytes}); at most {room}"
        )
    if config.max_write_bytes > room:  # as for the result budget: follow a smaller message limit
        config = dataclasses.replace(config, max_write_bytes=max(room, 1))
    if data.get("timeouts") is not None:  # top-level ``timeouts:`` map, tool name -> seconds
        config = dataclasses.replace(config, timeouts=parse_timeouts(data["timeouts"]))
    return config


def _shutdown(data: Mapping[str, Any]) -> bool:
    """``shutdown: {remove_sessions: bool}`` (default false: sessions survive a restart)."""
    section = _section(data, "shutdown", "")
    _no_unknown(section, {"remove_sessions"}, "shutdown")
    value = section.get("remove_sessions", False)
    if not isinstance(value, bool):
        raise ConfigError(f"shutdown.remove_sessions: must be true or false, got {value!r}")
    return value


def _tls(value: Any) -> TlsFiles | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError("tls: must be a mapping with cert_file and key_file")
    _no_unknown(value, {"cert_file", "key_file", "client_ca_file"}, "tls")
    files: dict[str, Path] = {}
    for key in ("cert_file", "key_file", "client_ca_file"):
        raw = value.get(key)
        if raw is None and key == "client_ca_file":
            continue
        if not isinstance(raw, str) or not raw:
            raise ConfigError(f"tls.{key}: must be a path to a PEM file")
        path = Path(raw).expanduser()
        if not path.is_file():
            raise ConfigError(f"tls.{key}: {path} is not a readable file")
        files[key] = path
    return TlsFiles(**files)


def _check_sandbox(backend: str, section: Mapping[str, Any]) -> None:
    if backend != "docker":
        if section:
            raise ConfigError(f"sandbox.{sorted(section)[0]}: only the docker backend takes options")
        return
    from dispatcher.sandbox.docker.config import SandboxConfig

    SandboxConfig.from_mapping(section)


def _check_listen(addr: str) -> None:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"listen: expected HOST:PORT, got {addr!r}")


def _section(data: Mapping[str, Any], key: str, parent: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{_join(parent, key)}: must be a mapping")
    return value


def _str(data: Mapping[str, Any], key: str, parent: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{_join(parent, key)}: must be a non-empty string")
    return value


def _no_unknown(data: Mapping[str, Any], allowed: frozenset[str] | set[str], where: str) -> None:
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ConfigError(f"{_join(where, unknown[0])}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _dataclass_section(cls: type[_T], data: Mapping[str, Any], where: str) -> _T:
    """Fill a frozen dataclass of numbers from a mapping, checking names, types and signs."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    _no_unknown(data, set(fields), where)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        default = fields[key].default
        want_int = (isinstance(default, int) and not isinstance(default, bool)) or "max_" in key
        ok = isinstance(value, int) if want_int else isinstance(value, int | float)
        if isinstance(value, bool) or not ok or (value is not None and value <= 0):
            kind = "a positive integer" if want_int else "a positive number"
            raise ConfigError(f"{_join(where, key)}: expected {kind}, got {value!r}")
        kwargs[key] = value
    return cls(**kwargs)


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key
