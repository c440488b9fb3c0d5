"""The sections of the config file as pydantic models: the keys, their types, bounds and defaults.

Each model is closed (an unknown key is an error naming it) and frozen. ``ServerOptions``,
``Quotas``, ``TlsFiles`` and ``UidRange`` are also what the server reads at run time; the others are
turned into the domain's own types by ``dispatcher.config.load``. The policy sections
(``tool_confirmation``, ``approval_modes``, capabilities) are in ``policy.py``, ``egress:`` in
``egress.py``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, StringConstraints, model_validator

from dispatcher.config.egress import EgressSection
from dispatcher.config.policy import ApprovalModes, CapabilitiesSection, ToolConfirmation
from dispatcher.config_base import HostPort, KeyProblem, PositiveInt, Seconds, Section, Text
from dispatcher.core.call.ordering import Ordering
from dispatcher.core.call.settings import DispatcherConfig
from dispatcher.core.call.timeouts import MAX_TIMEOUT_SECONDS
from dispatcher.core.sessions.clock import MAX_CLOCK_SECONDS
from dispatcher.sandbox.container.config import Bytes, SandboxConfig
from dispatcher.sandbox.container.kubernetes_config import KubernetesConfig

RESULT_MESSAGE_MARGIN = 64 << 10
"""What a result message needs besides its budgeted bytes."""
MAX_ID = 0xFFFFFFFE
"""(uid_t)-1 means "leave unchanged" to chown; every id below it is real."""
TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_PIPELINE = DispatcherConfig()


class ServerOptions(Section):
    """``server:``: transport knobs of the gRPC server."""

    max_message_bytes: PositiveInt = 4 << 20
    """Largest message the server sends (a result is fitted under it, less 64 KiB)."""
    max_request_bytes: PositiveInt = 8 << 20
    """Largest request message the server receives; a bigger one is RESOURCE_EXHAUSTED as a whole.
    Leaves room for one tool input of ``dispatcher.max_input_bytes`` and its siblings."""
    keepalive_time_s: Seconds = 30.0
    """Seconds between keepalive pings on an idle connection."""
    keepalive_timeout_s: Seconds = 10.0
    """Seconds a keepalive ping may go unanswered before the connection is closed."""
    grace_seconds: Seconds = 10.0
    """On SIGTERM: how long in-flight calls may finish before they are cancelled."""
    max_concurrent_streams: PositiveInt = 1000
    """Streams at once on one connection."""
    max_upload_bytes: PositiveInt = 1 << 30
    """Bytes of tar archive one UploadFiles may send; more is RESOURCE_EXHAUSTED, nothing written."""
    max_upload_files: PositiveInt = 100_000
    """Files and directories in one UploadFiles."""
    max_download_bytes: PositiveInt = 1 << 30
    """Bytes of file content one DownloadFiles may carry; more is RESOURCE_EXHAUSTED."""


def _readable_file(value: str) -> Path:
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"{path} is not a readable file")
    return path


PemFile = Annotated[Path, BeforeValidator(_readable_file, json_schema_input_type=str)]


class TlsFiles(Section):
    """``tls:``: PEM files for serving over TLS; with ``client_ca_file`` clients must present a certificate."""

    cert_file: PemFile
    """The server's certificate chain (PEM)."""
    key_file: PemFile
    """Its private key (PEM)."""
    client_ca_file: PemFile | None = None
    """CA that client certificates must chain to; set: mutual TLS."""


def _url_path(value: str) -> str:
    if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", value):
        raise ValueError(f"expected a URL path like /mcp, got {value!r}")
    return value


class McpEndpointSection(Section):
    """``mcp_endpoint:``: MCP's streamable HTTP transport served by the server itself, beside gRPC
    (README: Use it from an MCP host). Each MCP session is one dispatcher session of the tenant
    whose bearer token opened it; the URL's query names it: ``?workspace=W&mode=M&tools=a,b`` or
    ``?session=ID``."""

    listen: HostPort
    """HOST:PORT of the HTTP endpoint (plaintext: keep it on loopback or behind a TLS proxy)."""
    path: Annotated[str, Field(strict=True), AfterValidator(_url_path)] = "/mcp"
    """The endpoint's URL path."""
    max_sessions_per_tenant: PositiveInt = 8
    """MCP sessions one tenant may hold open at once; one more is refused (HTTP 429)."""
    idle_timeout_seconds: Seconds = 1800.0
    """An MCP session without a request in flight this long ends (and its dispatcher session with it)."""
    keep_sessions: StrictBool = False
    """Leave the dispatcher session a ended MCP session created open (``dispatcher sessions`` shows it)."""


NonNegativeSeconds = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
"""Seconds, where 0 means "none" (or "at once")."""
ClockSeconds = Annotated[float, Field(strict=True, ge=0, le=MAX_CLOCK_SECONDS, allow_inf_nan=False)]
"""A session clock's length (0: none), at most the 10 years a request may ask for too."""


class SessionsSection(Section):
    """``sessions:``: the clocks a session runs under unless its CreateSession asks otherwise."""

    ttl_seconds: ClockSeconds = 86_400.0
    """Absolute lifetime from creation (renewable); 0: none."""
    idle_timeout_seconds: ClockSeconds = 3_600.0
    """Time without activity (a request, a call in flight, a process running in the sandbox)
    before the session expires; 0: none."""
    on_expire: Literal["close", "pause"] = "close"
    """What a clock running out does: close the session (its sandbox removed, the workspace kept)
    or pause it (its sandbox frozen, memory kept)."""
    expiring_notice_seconds: NonNegativeSeconds = 300.0
    """How long before an expiry ``session.expiring`` is published (once); 0: never."""


class PreviewSection(Section):
    """``preview:``: the gateway that serves sandbox ports to browsers (off unless ``listen``)."""

    listen: HostPort | None = None
    """HOST:PORT the gateway listens on (plain HTTP: put a TLS reverse proxy in front of it for
    anything but loopback; README: Preview and port-forward)."""
    domain: Annotated[
        str,
        Field(
            strict=True,
            pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$",
        ),
    ] = "localhost"
    """Preview URLs are ``http://{port}-{session_id}.{domain}``: a wildcard DNS name (and
    certificate) ``*.{domain}`` must reach the gateway. ``localhost``: browsers resolve
    ``*.localhost`` to loopback, no DNS needed."""
    public_url: Annotated[str, Field(strict=True, pattern=r"^https?://[^/]*$")] | None = None
    """How URLs start when a reverse proxy is in front (``https://{domain}``; the port and session
    are put before the domain); default ``http://`` and the listen port."""
    allow_public: tuple[str, ...] = ()
    """Tenants that may open a port with ``public: true`` (no token)."""
    max_body_bytes: PositiveInt = 1 << 30
    """The largest request body the gateway carries to a sandbox."""


class Quotas(Section):
    """``quotas:`` of a tenant: a request past one is RESOURCE_EXHAUSTED."""

    max_sessions: PositiveInt = 100
    """Open sessions. Each keeps at most ``dispatcher.event_history_bytes`` of event history, so a
    tenant's history is bounded by ``max_sessions`` x that (800 MiB with the defaults)."""
    max_concurrent_dispatches: PositiveInt = 32
    """Dispatch streams running at once. Each holds at most 16 MiB of results its client has not
    read (plus one result in flight), so that memory is bounded per tenant too."""
    max_watch_streams: PositiveInt = 32
    """WatchSession and WatchProcess streams open at once (together)."""
    queue_timeout_seconds: NonNegativeSeconds = 30.0
    """With every dispatch slot taken, how long a Dispatch waits for one (first come, first
    served) before RESOURCE_EXHAUSTED; 0: refused at once."""
    max_concurrent_transfers: PositiveInt = 8
    """UploadFiles and DownloadFiles running at once (apart from the dispatch slots)."""
    max_snapshots: PositiveInt = 20
    """Snapshots kept (``SnapshotSession``); past it, RESOURCE_EXHAUSTED until one is deleted."""
    max_snapshot_bytes: Bytes = 10 << 30
    """Bytes all its snapshots hold on the server's disk (workspaces and ``/tmp``; ``10g``), a
    fork's temporary copy of a session included while it lasts. Counted as each copy is written:
    a copy that would pass it stops there, is removed, and is RESOURCE_EXHAUSTED."""
    max_snapshot_entries: PositiveInt = 1_000_000
    """Files, directories and links one snapshot (or a fork's copy) may hold, its workspace and
    ``/tmp`` together: the inodes a copy takes on the server's disk. Past it, the copy stops, is
    removed, and is RESOURCE_EXHAUSTED."""
    max_port_connections: PositiveInt = 64
    """Connections to its sandboxes' ports open at once (ConnectPort), all sessions together.
    Each buffers at most a window each way (1.5 MiB), so their memory is bounded too."""
    max_port_connections_per_session: PositiveInt = 16
    """Of those, how many one session may hold."""


def _not_root(value: int) -> int:
    if not 0 < value <= MAX_ID:
        raise ValueError(f"must be a number from 1 to {MAX_ID} (never root), got {value!r}")
    return value


HostId = Annotated[
    int, Field(strict=True, json_schema_extra={"minimum": 1, "maximum": MAX_ID}), AfterValidator(_not_root)
]
"""A host uid or gid: never 0 (root), never (uid_t)-1."""


class UidRange(Section):
    """``tenant_uids:``: where tenants without an explicit ``uid`` get theirs."""

    start: Annotated[int, Field(strict=True)] = 200_000
    """The first uid handed out (never 0)."""
    count: Annotated[int, Field(strict=True)] = 100_000
    """How many uids the range holds."""

    @model_validator(mode="after")
    def _no_root_and_in_range(self) -> UidRange:
        if self.start < 1:
            raise KeyProblem("start", f"must be at least 1 (never root), got {self.start}")
        if self.count < 1 or self.start + self.count - 1 > MAX_ID:
            raise KeyProblem("count", f"must be positive and end at most at {MAX_ID}")
        return self

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.start <= uid < self.start + self.count


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


_LEVELS = ("debug", "info", "warning", "error", "DEBUG", "INFO", "WARNING", "ERROR")


class LogSection(Section):
    """``log:``: how the server logs."""

    format: Literal["json", "text"] = "json"
    """One JSON object per line (tenant, session, tool_use_id, tool, trace_id) or plain text."""
    level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR"],
        BeforeValidator(_upper, json_schema_input_type=Literal[_LEVELS]),
    ] = "INFO"
    """Least severe record logged (any case)."""


class ShutdownSection(Section):
    """``shutdown:``: what a graceful stop does."""

    remove_sessions: StrictBool = False
    """True: a graceful stop closes every session (removing its container and its stored state)
    instead of keeping them for the next start."""


def _lower_name(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


_ORDERING_NAMES = tuple(o.value for o in Ordering) + tuple(o.value.upper() for o in Ordering)


class DispatcherSection(Section):
    """``dispatcher:``: knobs of the dispatch pipeline; defaults are spec 000's."""

    concurrency: PositiveInt = _PIPELINE.concurrency
    """Tool calls of one Dispatch running at once."""
    default_timeout: Seconds = _PIPELINE.default_timeout
    """Seconds a NONE, READ or WRITE tool may run."""
    execute_timeout: Seconds = _PIPELINE.execute_timeout
    """Seconds an EXECUTE or NETWORK tool (shell) may run."""
    abandon_after: Seconds = _PIPELINE.abandon_after
    """Seconds a tool that ignores its cancellation gets before it is abandoned."""
    confirmation_timeout: Seconds = _PIPELINE.confirmation_timeout
    """Seconds a confirmation request waits for its answer."""
    result_budget_chars: PositiveInt = _PIPELINE.result_budget_chars
    """Characters of text one result may carry before it is cut."""
    confirmation_max_chars: PositiveInt = _PIPELINE.confirmation_max_chars
    """Longest input a confirmation request shows; a longer one needing approval is refused unseen."""
    result_budget_bytes: PositiveInt = _PIPELINE.result_budget_bytes
    """Most bytes one result may carry, images included; a bigger one is cut or an error result.
    Default and ceiling: ``server.max_message_bytes`` less 64 KiB."""
    event_history: PositiveInt = _PIPELINE.event_history
    """Per session: events kept for replay."""
    event_history_bytes: PositiveInt = _PIPELINE.event_history_bytes
    """Per session: the oldest events leave the replay history beyond this many (estimated) bytes."""
    max_write_bytes: PositiveInt = _PIPELINE.max_write_bytes
    """Largest file one write_file writes (decoded bytes); more is that call's validation error.
    Its input, base64 included (a third more), must fit ``max_input_bytes``."""
    max_input_bytes: PositiveInt = _PIPELINE.max_input_bytes
    """Largest input_json of one tool_use; more is that call's validation error (reason
    ``input_too_large``), its siblings run. At most ``server.max_request_bytes`` less 64 KiB."""
    max_staged_changes: PositiveInt = _PIPELINE.max_staged_changes
    """Per review/audit session: files with a staged change, kept off the disk until a human
    applies or discards them; a write staged beyond is the call's error naming this key."""
    max_staged_bytes: PositiveInt = _PIPELINE.max_staged_bytes
    """Per review/audit session: bytes its staged changes hold (content and diff), in memory and in
    ``state.db``."""


class DispatchSection(Section):
    """``dispatch:``: how a Dispatch request runs when it does not say."""

    ordering: Annotated[
        Ordering, BeforeValidator(_lower_name, json_schema_input_type=Literal[_ORDERING_NAMES])
    ] = _PIPELINE.ordering
    """How one message's calls run relative to each other when its DispatchRequest leaves
    ``ordering`` unset: ``concurrent`` (spec 000), ``sequential`` or ``reads_concurrent``."""


def _tokens(value: object) -> object:
    return [value] if isinstance(value, str) else value


def _sha256s(value: tuple[str, ...]) -> tuple[str, ...]:
    if not value:
        raise ValueError("must be a sha256 hex digest or a non-empty list of them")
    for digest in value:
        if not _SHA256_RE.match(digest.lower()):
            raise ValueError(f"{digest!r} is not a sha256 hex digest")
    return tuple(d.lower() for d in value)


Sha256 = Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9a-fA-F]{64}$")]
Sha256List = Annotated[
    tuple[Annotated[str, Field(strict=True)], ...],
    BeforeValidator(_tokens, json_schema_input_type=Sha256 | Annotated[list[Sha256], Field(min_length=1)]),
    AfterValidator(_sha256s),
]


class TenantSection(CapabilitiesSection):
    """One tenant: who it is (token hashes), where its workspaces live and what it may do."""

    id: Annotated[str, StringConstraints(strict=True, pattern=TENANT_ID_PATTERN)]
    """Its name in logs, metrics, labels and paths; unique."""
    token_sha256: Sha256List
    """The sha256 hex digest of each bearer token (one or a list)."""
    workspace_root: Text | None = None
    """Where its workspaces live; relative: under the server's home (default: home/workspaces/<id>)."""
    tool_confirmation: ToolConfirmation | None = None
    """Laid over the server's policy."""
    quotas: Quotas = Field(default_factory=Quotas)
    """Its limits on sessions and streams."""
    uid: HostId | None = None
    """Host uid of its sandboxes (omit: allocated from ``tenant_uids``)."""
    gid: HostId | None = None
    """Host gid (omit: the uid)."""
    approval_modes: ApprovalModes | None = None
    """The approval modes its sessions may choose; the first is what a session that names none gets
    (omit: the top-level ``approval_modes``)."""
    egress: EgressSection | None = None
    """What its sandboxes reach through the egress proxy: keys laid over the top-level ``egress:``."""
    max_session_ttl_seconds: Annotated[Seconds, Field(le=MAX_CLOCK_SECONDS)] | None = None
    """The longest its sessions may live, counted from creation, renewals and pauses included
    (omit: no maximum but the 10 years any session clock may have)."""

    @model_validator(mode="after")
    def _gid_needs_uid(self) -> TenantSection:
        if self.gid is not None and self.uid is None:
            raise KeyProblem("gid", "needs a uid as well")
        return self


class SandboxSection(SandboxConfig):
    """``sandbox:``: the backend and how its sandboxes are made (docker and kubernetes share the
    image, limits, user, idle and lifetime keys; ``kubernetes:`` adds the cluster's)."""

    backend: Literal["docker", "kubernetes", "local"] = "docker"
    """``docker`` (one container per session), ``kubernetes`` (one Pod per session) or ``local``
    (tests and trusted development only)."""
    kubernetes: KubernetesConfig | None = None
    """With ``backend: kubernetes``: the namespace, credentials and Pod placement."""

    @model_validator(mode="after")
    def _options_fit_the_backend(self) -> SandboxSection:
        others = sorted(self.model_fields_set - {"backend"})
        if self.backend == "local" and set(others) - {"processes"}:
            key = sorted(set(others) - {"processes"})[0]
            raise KeyProblem(key, "the local backend takes no options but processes")
        if self.backend == "docker" and "kubernetes" in others:
            raise KeyProblem("kubernetes", "only with backend: kubernetes")
        if self.backend == "kubernetes":
            docker_only = sorted(set(others) & _DOCKER_ONLY)
            if docker_only:
                key = docker_only[0]
                raise KeyProblem(key, "only the docker backend takes this option" + _INSTEAD.get(key, ""))
        return self

    def container(self) -> SandboxConfig:
        """The sandbox config shared by both container backends: every key but ``backend`` and
        ``kubernetes``, as the file set them."""
        return SandboxConfig.model_validate(
            {k: getattr(self, k) for k in self.model_fields_set - {"backend", "kubernetes"}}
        )

    def cluster(self) -> KubernetesConfig:
        """``sandbox.kubernetes`` (its defaults when absent)."""
        return self.kubernetes or KubernetesConfig()


_DOCKER_ONLY = frozenset(
    {"network_mode", "runtime", "pin_cpus", "init", "exec_fallback", "agent_socket", "workspace_quota_mode",
     "workspace_watch_interval_seconds", "chown_workspace", "tmp_exec", "pids_limit"}
)  # fmt: skip
"""What a Pod cannot have as the Docker backend does (``runtime``: use
``kubernetes.runtime_class_name``; ``pids_limit``: the kubelet's ``podPidsLimit`` is node config)."""
_INSTEAD = {
    "runtime": "; use kubernetes.runtime_class_name",
    "pids_limit": (
        "; a Pod has no process limit of its own: the kubelet's podPidsLimit (node configuration)"
        " bounds each Pod's processes, so set it on the sandbox nodes"
    ),
}
"""What to do instead, where there is something."""


TimeoutSeconds = Annotated[float, Field(strict=True, gt=0, le=MAX_TIMEOUT_SECONDS, allow_inf_nan=False)]
Timeouts = dict[Annotated[str, StringConstraints(strict=True, min_length=1)], TimeoutSeconds]
"""``timeouts:``: tool name -> seconds, over the tool's own and the class defaults."""
