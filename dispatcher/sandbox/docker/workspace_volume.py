"""Per-tenant disk quota: each tenant's workspace root on its own loop-mounted ext4 image.

``sandbox.workspace_quota`` bytes per tenant, enforced by the kernel: the image
``<home>/volumes/<tenant>.img`` (a sparse file) is formatted once and mounted ``nosuid,nodev`` at the
tenant's workspace root when the server starts, before any workspace is created under it, so a host
user still finds every file where it was (while the server runs). A write past the quota gets
ENOSPC inside the sandbox and nothing else on the host fills; setuid bits and device nodes a sandbox
leaves there have no effect on the host.

When that is impossible (the server is not root, no loop devices or no ``mkfs.ext4``, or the root
already holds files that are not on such a volume) the server says so at start and watches usage
instead: every ``workspace_watch_interval_seconds`` it adds up each tenant's tree; a tenant over its
quota gets a clear error on new sandbox launches and its running sandboxes are removed. Then a
``nosuid,nodev`` bind mount of the root (as root), or stripping setuid/setgid bits during the scan,
keeps setuid binaries inert.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from typing import Literal

from dispatcher.core.errors import ToolExecutionError
from dispatcher.core.sandbox_api import SandboxError
from dispatcher.sandbox.container.config import format_size

log = logging.getLogger(__name__)

Enforcement = Literal["kernel", "watch", "off"]
MAX_SCAN_DEPTH = 512
"""Directories deeper than this are not measured (each level holds one fd while scanning)."""
_MKFS_TIMEOUT = 120.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SETID = stat.S_ISUID | stat.S_ISGID


class WorkspaceQuotaExceeded(ToolExecutionError):
    """A watched tenant is over its disk quota: its calls fail until it deletes files."""


@dataclass(slots=True)
class TenantVolume:
    """How one tenant's workspace root is bounded, and what the server mounted there."""

    tenant_id: str
    root: str
    enforcement: Enforcement
    mounted: bool = False
    """The server mounted something at ``root`` (the image, or a nosuid bind) and unmounts it."""
    used: int = 0
    over_quota: bool = False


def mount_entry(path: str) -> tuple[str, str, str] | None:
    """(source, fs type, options) of the mount whose mount point is exactly ``path``, if any."""
    found: tuple[str, str, str] | None = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 6 or _unescape(fields[4]) != path:
                continue
            tail = right.split()
            # The last mount on a path is the visible one.
            found = (tail[1] if len(tail) > 1 else "", tail[0] if tail else "", fields[5])
    return found


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def loop_backing_file(device: str) -> str | None:
    """The file behind ``/dev/loopN``, if it is a loop device."""
    name = os.path.basename(device)
    if not name.startswith("loop"):
        return None
    try:
        with open(f"/sys/block/{name}/loop/backing_file", encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return None


def attached_loop(image: str) -> str | None:
    """The loop device the image is still attached to, if any: a previous run's containers kept
    using it after that server stopped (sessions survive restarts)."""
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return None
    real = os.path.realpath(image)
    for name in sorted(names):
        if name.startswith("loop") and loop_backing_file(name) == real:
            return f"/dev/{name}"
    return None


def kernel_quota_unavailable() -> str | None:
    """Why loop-mounted images cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "the server is not root"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control is missing)"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/bootstrap.sh installs e2fsprogs and mount)"
    return None


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=_MKFS_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise SandboxError(f"{' '.join(argv)} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")


def _entries(path: str) -> list[str]:
    return [name for name in os.listdir(path) if name != "lost+found"]


class WorkspaceVolumes:
    """The quota volumes of every tenant root; prepare at start, release at shutdown (blocking)."""

    def __init__(self, quota: int | None, volumes_dir: str | None, *, mode: str = "auto") -> None:
        self.quota = quota
        self.volumes_dir = volumes_dir
        self.mode = mode
        self.tenants: dict[str, TenantVolume] = {}

    def prepare(self, tenant_id: str, root: str) -> TenantVolume:
        """Bound ``root`` (made if missing) for ``tenant_id``; logs clearly what is enforced how.

        Raises:
            SandboxError: formatting or mounting the image failed.
        """
        root = os.path.realpath(root)
        os.makedirs(root, mode=0o755, exist_ok=True)
        volume = TenantVolume(tenant_id, root, "off")
        self.tenants[tenant_id] = volume
        if not self.quota:
            return volume
        why_not = (
            kernel_quota_unavailable() if self.mode != "watch" else "sandbox.workspace_quota_mode is watch"
        )
        if why_not is None and self.volumes_dir is None:
            why_not = "the sandbox provider has no state directory for the images"
        if why_not is None:
            why_not = self._mount_image(volume)
        if why_not is not None:
            log.warning(
                "tenant %s: the workspace quota of %s is NOT enforced by the kernel (%s); watching usage"
                " of %s instead (over quota: new calls fail and its sandboxes are removed)",
                tenant_id,
                format_size(self.quota),
                why_not,
                root,
            )
            volume.enforcement = "watch"
            self._harden_without_image(volume)
        return volume

    def _mount_image(self, volume: TenantVolume) -> str | None:
        """Mount the tenant's image at its root; a reason string when it must not be done."""
        assert self.volumes_dir is not None and self.quota
        image = os.path.join(self.volumes_dir, f"{volume.tenant_id}.img")
        current = mount_entry(volume.root)
        if current is not None:
            if loop_backing_file(current[0]) == image:
                # Left mounted by a previous run that did not stop cleanly: adopt it.
                volume.enforcement, volume.mounted = "kernel", True
                return None
            return f"{volume.root} is already a mount point ({current[1]} from {current[0]})"
        if _entries(volume.root):
            return (
                f"{volume.root} already holds files and is not a quota volume; to move them onto one,"
                " stop the server, move them out, start it, and move them back"
            )
        os.makedirs(self.volumes_dir, mode=0o700, exist_ok=True)
        fresh = not os.path.exists(image)
        if fresh:
            fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, self.quota)  # sparse: takes disk only as the tenant writes
            finally:
                os.close(fd)
            try:
                _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", "-L", "dispatcher", image])
            except SandboxError:
                os.unlink(image)
                raise
        elif os.path.getsize(image) != self.quota:
            log.warning(
                "tenant %s: keeping the existing %s volume %s (sandbox.workspace_quota is %s now;"
                " resize it with resize2fs while the server is stopped)",
                volume.tenant_id,
                format_size(os.path.getsize(image)),
                image,
                format_size(self.quota),
            )
        # discard: blocks a sandbox frees are punched out of the sparse image, so the host gets its
        # disk back when files are deleted, not only when the tenant goes away.
        attached = attached_loop(image)
        if attached is not None:
            # Mount that same device: a second loop device on the image would be a second, unaware
            # ext4 over the same blocks (the kept containers still write through the first).
            _run(["mount", "-t", "ext4", "-o", "nosuid,nodev,noatime,discard", attached, volume.root])
        else:
            _run(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime,discard", image, volume.root])
        volume.enforcement, volume.mounted = "kernel", True
        # What an earlier run freed but did not discard before it stopped (a kill, a lazy unmount).
        with contextlib.suppress(SandboxError, OSError, subprocess.TimeoutExpired):
            _run(["fstrim", volume.root])
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(volume.root, "lost+found"))
        os.chmod(volume.root, 0o755)
        log.info(
            "tenant %s: workspaces on a %s volume (%s, nosuid,nodev)",
            volume.tenant_id,
            format_size(os.path.getsize(image)),
            image,
        )
        return None

    def _harden_without_image(self, volume: TenantVolume) -> None:
        """nosuid,nodev for a root that is not on a quota volume: a bind mount of itself, as root."""
        if os.geteuid() != 0 or mount_entry(volume.root) is not None:
            return
        try:
            _run(["mount", "--bind", volume.root, volume.root])
            volume.mounted = True
            _run(["mount", "-o", "remount,bind,nosuid,nodev", volume.root])
        except (SandboxError, OSError, subprocess.SubprocessError) as exc:
            log.warning("tenant %s: cannot make %s nosuid,nodev: %s", volume.tenant_id, volume.root, exc)

    def check(self, tenant_id: str) -> None:
        """Refuse a launch for a tenant over its quota (watched tenants only).

        Raises:
            WorkspaceQuotaExceeded: naming the quota and the usage.
        """
        volume = self.tenants.get(tenant_id)
        if volume is not None and volume.over_quota and self.quota:
            raise WorkspaceQuotaExceeded(
                f"tenant {tenant_id!r} is over its workspace quota: {format_size(volume.used)} used of"
                f" {format_size(self.quota)} (sandbox.workspace_quota); delete files to continue"
            )

    def scan(self) -> list[str]:
        """Measure every watched tenant; returns the tenants that are over quota (blocking)."""
        over: list[str] = []
        for volume in self.tenants.values():
            if volume.enforcement != "watch" or not self.quota:
                continue
            volume.used = tree_usage(volume.root, strip_setid=os.geteuid() != 0 or not volume.mounted)
            volume.over_quota = volume.used > self.quota
            if volume.over_quota:
                over.append(volume.tenant_id)
        return over

    def release(self) -> None:
        """Unmount what ``prepare`` mounted (shutdown; blocking)."""
        for volume in self.tenants.values():
            if not volume.mounted:
                continue
            proc = subprocess.run(["umount", volume.root], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                # Busy (a host shell inside it): detach now, the kernel finishes when it is left.
                subprocess.run(["umount", "-l", volume.root], capture_output=True, check=False)
            volume.mounted = False


def tree_usage(root: str, *, strip_setid: bool) -> int:
    """Bytes allocated under ``root`` on its filesystem, never following a link (blocking).

    Walks with directory fds (a sandbox may swap a directory for a symlink meanwhile); with
    ``strip_setid``, setuid/setgid bits found on regular files are removed on the way.
    """
    top = os.open(root, _DIR_FLAGS)
    root_dev = os.fstat(top).st_dev
    total, subdirs = _scan_dir(top, root_dev, strip_setid)
    stack = [(top, iter(subdirs))]
    while stack:
        fd, pending = stack[-1]
        name = next(pending, None)
        if name is None:
            os.close(fd)
            stack.pop()
            continue
        if len(stack) >= MAX_SCAN_DEPTH:
            continue
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            continue
        used, below = _scan_dir(child, root_dev, strip_setid)
        total += used
        stack.append((child, iter(below)))
    return total


def _scan_dir(fd: int, root_dev: int, strip_setid: bool) -> tuple[int, list[str]]:
    total = 0
    subdirs: list[str] = []
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += st.st_blocks * 512
                if stat.S_ISDIR(st.st_mode) and st.st_dev == root_dev:
                    subdirs.append(entry.name)
                elif strip_setid and stat.S_ISREG(st.st_mode) and st.st_mode & _SETID:
                    _strip_setid(fd, entry.name)
    except OSError:
        pass
    return total, subdirs


def _strip_setid(dir_fd: int, name: str) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~_SETID)
    except OSError:
        pass
    finally:
        os.close(fd)
