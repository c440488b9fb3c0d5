"""Configuration of the container sandbox (``sandbox:``, both hosts'): every hardening knob, with its
safe default.

The server's YAML loader hands the ``sandbox:`` section to ``SandboxConfig.from_mapping``; errors
name the offending key (``sandbox.pids_limit: ...``) so an operator can fix the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, model_validator

from dispatcher.config_base import KeyProblem, PositiveInt, Seconds, Section, Text, validate_section
from dispatcher.core.errors import ConfigError

WORKSPACE_ROOT = "/workspace"
"""Where the session's workspace is bind-mounted inside every sandbox."""
AGENT_PATH = "/opt/dispatcher/agent.pyz"
"""Where sandbox_images/build.sh installs the agent (the package ``dispatcher/sandbox/agent/`` as one
zipapp); a custom image must have it there too."""
DEFAULT_IMAGE = "dispatcher-sandbox:latest"

CA_TARGET = "/opt/dispatcher/ca-bundle.crt"
"""Where a tenant's ``egress.ca_bundle`` is mounted (read-only) in its sandboxes."""

RUNSC_MIN_PIDS = 128
"""gVisor's own sentry threads count against the pids cgroup; below this, containers fail to start."""

_SIZE_RE = re.compile(r"^(\d+)([kmg]?)b?$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_TMPFS_SIZE_RE = re.compile(r"^\d+[kmg]?$", re.IGNORECASE)
_USER_RE = re.compile(r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$")


def parse_size(value: object) -> int:
    """Bytes from ``512m``-style sizes (k, m, g are powers of 1024) or a positive integer.

    Raises:
        ConfigError: not a size.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise ConfigError(f"must be positive, got {value}")
        return value
    match = _SIZE_RE.match(value.strip()) if isinstance(value, str) else None
    if not match:
        raise ConfigError(f"expected a size like 512m, got {value!r}")
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if size <= 0:
        raise ConfigError(f"must be positive, got {value!r}")
    return size


def format_size(size: int) -> str:
    """``size`` bytes as people read it (``10 GiB``), exact or in bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} bytes"


def _at_least(floor: int, shown: str) -> Any:
    def check(size: int | None) -> int | None:
        if size is not None and size < floor:
            raise ValueError(f"must be at least {shown}, got {size} bytes")
        return size

    return AfterValidator(check)


def _at_most(ceiling: int, shown: str) -> Any:
    def check(size: int) -> int:
        if size > ceiling:
            raise ValueError(f"must be at most {shown}, got {size} bytes")
        return size

    return AfterValidator(check)


def _names(value: object) -> object:
    return [value] if isinstance(value, str) else value


def _quota(value: object) -> object:
    return None if value is None or value == 0 else parse_size(value)


def _tmpfs_size(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not _TMPFS_SIZE_RE.match(value):
        raise ValueError(f"expected a size like 64m, got {value!r}")
    return value


def _user(value: str) -> str:
    if not _USER_RE.match(value):
        raise ValueError(f"expected uid[:gid] or a name, got {value!r}")
    if value.split(":")[0] in {"0", "root"}:
        raise ValueError("must not be root")
    return value


def _labels(value: dict[str, str]) -> dict[str, str]:
    if any(k.startswith("dispatcher.") for k in value):
        raise ValueError("the dispatcher.* labels are reserved")
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be absolute, got {value!r}")
    return value


Capability = Annotated[str, Field(strict=True, min_length=1), AfterValidator(str.upper)]
SizeText = Annotated[str, Field(pattern=_SIZE_RE.pattern)]
"""``512m``, ``64k``, ``1g`` (any case; powers of 1024)."""
Bytes = Annotated[
    int, BeforeValidator(parse_size, json_schema_input_type=Annotated[int, Field(gt=0)] | SizeText)
]
CapabilityNames = Annotated[
    tuple[Capability, ...],
    BeforeValidator(_names, json_schema_input_type=str | list[Annotated[str, Field(min_length=1)]]),
]


class WarmPoolConfig(Section):
    """``sandbox.warm_pool``: containers made before any session asks (``docker/pool/``)."""

    size: Annotated[int, Field(strict=True, ge=0, le=256)] = 0
    """Containers kept created, started and with their agent answering, across all sandbox users
    (0: no pool). Each holds about one idle session's memory (see the README's sizing note)."""


class ProcessLimits(Section):
    """``sandbox.processes``: the bounds of a session's background processes, kept by its agent
    (the agent's ``--process-limits``, same names; given only when not these defaults)."""

    running: Annotated[int, Field(strict=True, gt=0, le=1024)] = 32
    """Processes running at once in one session; one more is refused (``too_many``)."""
    ring_bytes: Annotated[Bytes, _at_least(1 << 10, "1k")] = 1 << 20
    """Output (stdout and stderr) kept per process when its start does not say: the newest bytes;
    a reader further behind is told how many it lost."""
    max_ring_bytes: Annotated[Bytes, _at_least(1 << 10, "1k")] = 16 << 20
    """The largest output ring a start may ask for (``too_large`` past it)."""
    total_ring_bytes: Annotated[Bytes, _at_least(1 << 10, "1k")] = 64 << 20
    """All rings of one session together, finished processes' included (the oldest finished are
    forgotten first, then a start is refused ``too_large``). Held in the agent's memory, so
    within ``sandbox.mem_limit``."""
    finished: Annotated[int, Field(strict=True, gt=0, le=4096)] = 64
    """Finished processes kept readable per session; the oldest is forgotten first."""
    stdin_bytes: Annotated[Bytes, _at_least(1, "1"), _at_most(32 << 20, "32m")] = 1 << 20
    """Input waiting for one process to read it; a write past it is refused whole (``too_large``)."""

    @model_validator(mode="after")
    def _rings_nest(self) -> ProcessLimits:
        if self.ring_bytes > self.max_ring_bytes:
            raise KeyProblem("ring_bytes", f"must not be more than max_ring_bytes ({self.max_ring_bytes})")
        if self.max_ring_bytes > self.total_ring_bytes:
            raise KeyProblem(
                "max_ring_bytes", f"must not be more than total_ring_bytes ({self.total_ring_bytes})"
            )
        return self


def process_limit_args(limits: ProcessLimits | None) -> list[str]:
    """``["--process-limits", JSON]`` with the keys that differ from the agent's defaults; ``[]``
    when none does (an agent of an older image need not know the option then)."""
    changed = {} if limits is None else limits.model_dump(exclude_defaults=True)
    if not changed:
        return []
    return ["--process-limits", json.dumps(changed, separators=(",", ":"), sort_keys=True)]


class SandboxConfig(Section):
    """How session containers are created. Defaults are the hardened ones; loosen knowingly."""

    image: Text = DEFAULT_IMAGE
    """The sandbox image (built by ``make images``; never pulled)."""
    network_mode: Text = "none"
    """Sandboxes get no network; anything else is the operator's explicit choice."""
    cap_drop: CapabilityNames = ("ALL",)
    """Linux capabilities removed (``ALL``: every one)."""
    cap_add: CapabilityNames = ()
    """Linux capabilities given back after ``cap_drop``."""
    no_new_privileges: StrictBool = True
    """No process in the sandbox gains privileges (setuid binaries do not elevate)."""
    user: Annotated[str, Field(strict=True), AfterValidator(_user)] = "1000:1000"
    """uid:gid of every process in the sandbox when the tenant has none of its own. Unless set in
    the config file, a single-tenant server uses the owner of the workspace root instead (this
    value when that owner is root), so what the sandbox writes stays the host user's. Never root."""
    read_only: StrictBool = True
    """The image's root filesystem is read-only."""
    tmpfs_size: Annotated[
        str,
        BeforeValidator(
            _tmpfs_size,
            json_schema_input_type=Annotated[int, Field(gt=0)]
            | Annotated[str, Field(pattern=_TMPFS_SIZE_RE.pattern)],
        ),
    ] = "64m"
    """Size of the writable tmpfs at /tmp (the only writable place besides /workspace)."""
    tmp_exec: StrictBool = True
    """Allow executing files in /tmp (docker's tmpfs default is noexec). /workspace is executable
    anyway, so noexec here would break build tools without containing anything."""
    pids_limit: PositiveInt = 256
    """Processes and threads at once in one sandbox."""
    mem_limit: Annotated[Bytes, _at_least(16 << 20, "16m")] = 512 << 20
    """Bytes (or 512m); swap is disabled by setting the memory+swap limit to the same value."""
    nano_cpus: PositiveInt = 1_000_000_000
    """CPU time in units of 1e-9 CPUs (1e9: one CPU)."""
    pin_cpus: StrictBool = True
    """Give each container a cpuset of ceil(nano_cpus / 1e9) CPUs (taken round-robin), so ``nproc``
    and thread-pool sizing inside see the limit, not the host's CPU count."""
    init: StrictBool = True
    """docker-init as pid 1 reaps zombies that sandboxed commands leave behind."""
    runtime: Text | None = None
    """None for the daemon's default (runc) or "runsc" for gVisor."""
    start_on_create: StrictBool = True
    """Start a session's container when the session is created, in the background, so the model's
    first call finds it running (about 4 ms instead of a launch's 230 ms). Each open session then
    holds a container whether it calls a sandboxed tool or not (bounded by ``max_sessions``; the
    idle TTL still removes unused ones). ``false``: launch at the first sandboxed call."""
    idle_ttl_seconds: Seconds = 600.0
    """Stop (and remove) a session's container after this long without calls; recreated on the next."""
    max_lifetime_seconds: Seconds | None = 86_400.0
    """Remove a session's container once it is this old, at the first moment no call runs in it,
    background processes or not (``null``: no limit); a new call waits for the running ones (each
    bounded by its timeout), then gets a fresh one and is told. Bounds how long anything a command
    leaves running can live."""
    instance: Text | None = None
    """Overrides the instance label the server derives from its state directory."""
    chown_workspace: StrictBool = True
    """When the server runs as root, directories it makes at launch (a missing ``rw`` grant) belong
    to the sandbox user. Nothing that exists is ever re-owned."""
    agent_path: Annotated[str, Field(strict=True), AfterValidator(_absolute)] = AGENT_PATH
    """Where the agent is in the image."""
    agent_python: Text = "python3"
    """The interpreter that runs the agent."""
    exec_fallback: StrictBool = False
    """Accept an image without python or the agent (the start-up check warns instead of failing):
    shell then runs through one ``docker exec`` per command and the file tools fail."""
    agent_socket: StrictBool = True
    """On runc, a container's agent speaks over a unix socket the server listens on (in a directory
    of the container's, mounted read-only) instead of through the Docker daemon's attach: about
    0.1-0.2 ms less per agent round trip. gVisor always uses attach; ``false``: every agent does."""
    agent_start_timeout: Seconds = 30.0
    """Deadline of the agent's first ping, counted once this container's launch has its slot."""
    max_concurrent_launches: PositiveInt = 4
    """Containers created and started at once; more wait their turn instead of starving each other."""
    op_timeout_seconds: Seconds = 30.0
    """Deadline of one file operation before the agent is declared hung and the container stopped."""
    enforce_slack_seconds: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] = 5.0
    """Past timeout + grace (or cancel + grace), how long the agent gets before the container is stopped."""
    workspace_quota: Annotated[
        int | None,
        BeforeValidator(_quota, json_schema_input_type=Annotated[int, Field(ge=0)] | SizeText | None),
        _at_least(1 << 20, "1m"),
    ] = 10 << 30
    """Bytes per tenant for all its workspaces (a loop-mounted ext4 image at the tenant's root, or
    a usage watcher when that is impossible); ``null`` or 0 turns the quota off."""
    workspace_quota_mode: Literal["auto", "watch"] = "auto"
    """``auto``: the kernel (loop-mounted image) when the server is root and has loop devices, else
    watching usage; ``watch``: always watch usage (no image)."""
    workspace_watch_interval_seconds: Seconds = 10.0
    """How often a watched tenant's usage is measured."""
    processes: ProcessLimits = Field(default_factory=ProcessLimits)
    """Bounds of a session's background processes (``process_list``, ``shell`` in the background)."""
    warm_pool: WarmPoolConfig = Field(default_factory=WarmPoolConfig)
    """A new session adopts a waiting container instead of launching one (runc, root, no fs grants)."""
    extra_labels: Annotated[
        dict[Annotated[str, Field(strict=True)], Annotated[str, Field(strict=True)]], AfterValidator(_labels)
    ] = Field(default_factory=dict)
    """Labels added to every container (the ``dispatcher.*`` ones are reserved)."""

    @model_validator(mode="after")
    def _runsc_needs_room(self) -> SandboxConfig:
        if self.runtime == "runsc" and self.pids_limit < RUNSC_MIN_PIDS:
            raise KeyProblem("pids_limit", f"runtime runsc needs at least {RUNSC_MIN_PIDS}")
        if self.processes.total_ring_bytes >= self.mem_limit:
            raise KeyProblem(
                "processes",
                f"total_ring_bytes ({format_size(self.processes.total_ring_bytes)}) must be less than"
                f" mem_limit ({format_size(self.mem_limit)}): the rings live in the sandbox's memory",
            )
        return self

    @property
    def uid(self) -> int | None:
        """Numeric uid when ``user`` gives one (used to hand the workspace over)."""
        head = self.user.split(":")[0]
        return int(head) if head.isdigit() else None

    @property
    def gid(self) -> int | None:
        parts = self.user.split(":")
        return int(parts[1]) if len(parts) == 2 and parts[1].isdigit() else None

    def user_for(self, uid: int | None, gid: int | None) -> str:
        """The ``uid:gid`` a session's sandbox runs as: its tenant's own ids when it has them, else
        ``user``. Refuses root, whatever the caller passes."""
        if uid is None:
            return self.user
        if uid <= 0 or (gid is not None and gid <= 0):
            raise ConfigError(f"sandbox uid/gid must not be root, got {uid}:{gid}")
        return f"{uid}:{uid if gid is None else gid}"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> SandboxConfig:
        """Build from the YAML ``sandbox:`` section (missing keys keep their defaults).

        Raises:
            ConfigError: unknown key, wrong type, or an invalid value; each line names its key.
        """
        config: SandboxConfig = validate_section(cls, data, "sandbox")
        return config
