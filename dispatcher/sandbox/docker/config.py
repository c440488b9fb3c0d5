"""Configuration of the Docker sandbox: every hardening knob, with its safe default.

The server's YAML loader hands the ``sandbox:`` section to ``SandboxConfig.from_mapping``; errors
name the offending key (``sandbox.pids_limit: ...``) so an operator can fix the file.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.core.errors import ConfigError

WORKSPACE_ROOT = "/workspace"
"""Where the session's workspace is bind-mounted inside every sandbox."""
AGENT_PATH = "/opt/dispatcher/agent.py"
"""Where sandbox_images/build.sh installs the agent; a custom image must have it there too."""
DEFAULT_IMAGE = "dispatcher-sandbox:latest"

LABEL_SESSION = "dispatcher.session"
LABEL_TENANT = "dispatcher.tenant"
LABEL_INSTANCE = "dispatcher.instance"

RUNSC_MIN_PIDS = 128
"""gVisor's own sentry threads count against the pids cgroup; below this, containers fail to start."""

_SIZE_RE = re.compile(r"^(\d+)([kmg]?)b?$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_TMPFS_SIZE_RE = re.compile(r"^\d+[kmg]?$", re.IGNORECASE)
_USER_RE = re.compile(r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$")


def parse_size(value: int | str, key: str) -> int:
    """Bytes from ``512m``-style sizes (k, m, g are powers of 1024).

    Raises:
        ConfigError: not a size.
    """
    if isinstance(value, bool):
        raise ConfigError(f"sandbox.{key}: expected a size like 512m, got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(f"sandbox.{key}: must be positive, got {value}")
        return value
    match = _SIZE_RE.match(str(value).strip())
    if not match:
        raise ConfigError(f"sandbox.{key}: expected a size like 512m, got {value!r}")
    size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if size <= 0:
        raise ConfigError(f"sandbox.{key}: must be positive, got {value!r}")
    return size


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How session containers are created. Defaults are the hardened ones; loosen knowingly."""

    image: str = DEFAULT_IMAGE
    network_mode: str = "none"
    """Sandboxes get no network; anything else is the operator's explicit choice."""
    cap_drop: tuple[str, ...] = ("ALL",)
    cap_add: tuple[str, ...] = ()
    no_new_privileges: bool = True
    user: str = "1000:1000"
    """uid:gid of every process in the sandbox when the tenant has none of its own. Unless set in
    the config file, a single-tenant server uses the owner of the workspace root instead (this
    value when that owner is root), so what the sandbox writes stays the host user's. Never root."""
    read_only: bool = True
    tmpfs_size: str = "64m"
    """Size of the writable tmpfs at /tmp (the only writable place besides /workspace)."""
    tmp_exec: bool = True
    """Allow executing files in /tmp (docker's tmpfs default is noexec). /workspace is executable
    anyway, so noexec here would break build tools without containing anything."""
    pids_limit: int = 256
    mem_limit: int = 512 << 20
    """Bytes; swap is disabled by setting the memory+swap limit to the same value."""
    nano_cpus: int = 1_000_000_000
    pin_cpus: bool = True
    """Give each container a cpuset of ceil(nano_cpus / 1e9) CPUs (taken round-robin), so ``nproc``
    and thread-pool sizing inside see the limit, not the host's CPU count."""
    init: bool = True
    """docker-init as pid 1 reaps zombies that sandboxed commands leave behind."""
    runtime: str | None = None
    """None for the daemon's default (runc) or "runsc" for gVisor."""
    idle_ttl_seconds: float = 600.0
    """Stop (and remove) a session's container after this long without calls; recreated on the next."""
    instance: str | None = None
    """Overrides the instance label the server derives from its state directory."""
    chown_workspace: bool = True
    """When the server runs as root, directories it makes at launch (a missing ``rw`` grant) belong
    to the sandbox user. Nothing that exists is ever re-owned."""
    agent_path: str = AGENT_PATH
    agent_python: str = "python3"
    exec_fallback: bool = False
    """Accept an image without python or the agent (the start-up check warns instead of failing):
    shell then runs through one ``docker exec`` per command and the file tools fail."""
    agent_start_timeout: float = 30.0
    """Deadline of the agent's first ping, counted once this container's launch has its slot."""
    max_concurrent_launches: int = 4
    """Containers created and started at once; more wait their turn instead of starving each other."""
    op_timeout_seconds: float = 30.0
    """Deadline of one file operation before the agent is declared hung and the container stopped."""
    enforce_slack_seconds: float = 5.0
    """Past timeout + grace (or cancel + grace), how long the agent gets before the container is stopped."""
    workspace_quota: int | None = 10 << 30
    """Bytes per tenant for all its workspaces (a loop-mounted ext4 image at the tenant's root, or
    a usage watcher when that is impossible); ``null`` or 0 turns the quota off."""
    workspace_quota_mode: str = "auto"
    """``auto``: the kernel (loop-mounted image) when the server is root and has loop devices, else
    watching usage; ``watch``: always watch usage (no image)."""
    workspace_watch_interval_seconds: float = 10.0
    """How often a watched tenant's usage is measured."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        if not self.image:
            raise ConfigError("sandbox.image: must not be empty")
        if not self.network_mode:
            raise ConfigError("sandbox.network_mode: must not be empty (use 'none')")
        if not _USER_RE.match(self.user):
            raise ConfigError(f"sandbox.user: expected uid[:gid] or a name, got {self.user!r}")
        if self.user.split(":")[0] in {"0", "root"}:
            raise ConfigError("sandbox.user: must not be root")
        if not _TMPFS_SIZE_RE.match(self.tmpfs_size):
            raise ConfigError(f"sandbox.tmpfs_size: expected a size like 64m, got {self.tmpfs_size!r}")
        if self.pids_limit <= 0:
            raise ConfigError(f"sandbox.pids_limit: must be positive, got {self.pids_limit}")
        if self.runtime == "runsc" and self.pids_limit < RUNSC_MIN_PIDS:
            raise ConfigError(f"sandbox.pids_limit: runtime runsc needs at least {RUNSC_MIN_PIDS}")
        if self.mem_limit < 16 << 20:
            raise ConfigError("sandbox.mem_limit: must be at least 16m")
        if self.nano_cpus <= 0:
            raise ConfigError(f"sandbox.nano_cpus: must be positive, got {self.nano_cpus}")
        if self.runtime is not None and not self.runtime:
            raise ConfigError("sandbox.runtime: must be a runtime name or null")
        for key in (
            "idle_ttl_seconds",
            "agent_start_timeout",
            "op_timeout_seconds",
            "max_concurrent_launches",
            "workspace_watch_interval_seconds",
        ):
            if getattr(self, key) <= 0:
                raise ConfigError(f"sandbox.{key}: must be positive")
        if self.workspace_quota is not None and self.workspace_quota < 1 << 20:
            raise ConfigError("sandbox.workspace_quota: must be at least 1m (or null for no quota)")
        if self.workspace_quota_mode not in ("auto", "watch"):
            raise ConfigError("sandbox.workspace_quota_mode: must be 'auto' or 'watch'")
        if self.enforce_slack_seconds < 0:
            raise ConfigError("sandbox.enforce_slack_seconds: must not be negative")
        if not self.agent_path.startswith("/"):
            raise ConfigError("sandbox.agent_path: must be absolute")

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
            ConfigError: unknown key, wrong type, or an invalid value; the message names the key.
        """
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise ConfigError(f"sandbox: expected a mapping, got {type(data).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(f"sandbox.{key}: unknown key (known: {', '.join(sorted(known))})")
            kwargs[key] = _coerce(str(key), value)
        return cls(**kwargs)


def _coerce(key: str, value: Any) -> Any:
    """Check one YAML value's type and convert it to the field's representation."""
    if key in {"cap_drop", "cap_add"}:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"sandbox.{key}: expected a list of capability names")
        return tuple(v.upper() for v in value)
    if key == "mem_limit":
        return parse_size(value, key)
    if key == "workspace_quota":
        return None if value is None or value == 0 else parse_size(value, key)
    if key == "extra_labels":
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ConfigError("sandbox.extra_labels: expected a mapping of strings to strings")
        if any(k.startswith("dispatcher.") for k in value):
            raise ConfigError("sandbox.extra_labels: the dispatcher.* labels are reserved")
        return dict(value)
    if key == "runtime":
        if value is not None and not isinstance(value, str):
            raise ConfigError("sandbox.runtime: expected a runtime name or null")
        return value
    if key == "instance":
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError("sandbox.instance: expected a non-empty string")
        return value
    if key == "tmpfs_size":
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError("sandbox.tmpfs_size: expected a size like 64m")
        return value
    if key in {
        "no_new_privileges",
        "read_only",
        "init",
        "chown_workspace",
        "tmp_exec",
        "exec_fallback",
        "pin_cpus",
    }:
        if not isinstance(value, bool):
            raise ConfigError(f"sandbox.{key}: expected true or false")
        return value
    if key in {"pids_limit", "nano_cpus", "max_concurrent_launches"}:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"sandbox.{key}: expected an integer")
        return value
    if key in {
        "idle_ttl_seconds",
        "agent_start_timeout",
        "op_timeout_seconds",
        "enforce_slack_seconds",
        "workspace_watch_interval_seconds",
    }:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"sandbox.{key}: expected a number of seconds")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"sandbox.{key}: expected a string")
    return value
