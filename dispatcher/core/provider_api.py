"""What a sandbox backend offers a server, declared once (``SandboxProvider``), and what the server
hands it when it makes it (``ProviderHooks``). What one session's sandbox offers is
``sandbox_api.py``'s."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dispatcher.core.errors import DispatcherError
from dispatcher.core.observe import NO_SANDBOX_OBSERVER, SandboxObserver
from dispatcher.core.sandbox_api import Sandbox, SandboxError
from dispatcher.egress.gate import EgressGate

if TYPE_CHECKING:
    from dispatcher.core.sessions.registry import Restoration
    from dispatcher.core.sessions.session import Session
    from dispatcher.core.sessions.state import SessionState


@dataclass(frozen=True, slots=True)
class ProviderHooks:
    """What a server hands its sandbox backend when it makes it: nothing is set on a provider
    after it was made."""

    observer: SandboxObserver = NO_SANDBOX_OBSERVER
    """Told of sandbox launches, launch failures and removals (metrics)."""
    on_container: Callable[[str, str | None], None] | None = None
    """Called with (session id, container id or None) when a session's container changes (stored)."""
    egress: EgressGate | None = None
    """The server's egress proxy: set, each sandbox's agent listens for proxy connections and hands
    them to it; None, sandboxes have no proxy (their network stays ``none`` either way)."""


@dataclass(frozen=True, slots=True)
class SessionUsage:
    """What one session's sandbox uses now (``GetSessionUsage``): its container's cgroup and its
    workspace on disk; the egress counters are the server's proxy's, added by the server."""

    cpu_seconds: float = 0.0
    """CPU time its container used since it started (user and system)."""
    cpu_percent: float = 0.0
    """Over about the last second; 100 is one whole CPU (a loop in one process)."""
    memory_bytes: int = 0
    """Memory in use, page cache that could be dropped excluded (as ``docker stats``); the tmpfs
    ``/tmp`` counts here."""
    memory_limit_bytes: int = 0
    """0: no limit."""
    disk_bytes: int = 0
    """The session's workspace on disk (blocks allocated)."""
    disk_limit_bytes: int = 0
    """The tenant's workspace quota, which all its sessions share (0: none)."""
    pids: int = 0
    """Processes and threads in its container."""
    egress_bytes_sent: int = 0
    """Through the egress proxy, from the sandbox, since the session opened (or the server started)."""
    egress_bytes_received: int = 0
    """Through the egress proxy, to the sandbox."""
    sample_time: float = 0.0
    """When it was measured (Unix seconds)."""
    running: bool = False
    """A container ran when it was measured (False: none yet, retired idle, or gone: the CPU,
    memory and pids are 0)."""


class UsageUnsupported(SandboxError):
    """This sandbox backend reports no usage per session; the message says what is missing."""


class SnapshotUnsupported(SandboxError):
    """This sandbox backend cannot copy a session's sandbox; the message says what is missing."""


BLOCK = 4096
"""What one file or directory is counted as at least, and what its bytes are rounded up to: the
copy is counted as ``du`` will measure it on the usual filesystems, before it is written."""


class CopyBudgetExceeded(DispatcherError):
    """A bounded copy stopped before its next entry or byte would pass its budget; what it wrote
    is for the caller to remove. The message says where it stopped and how far it got."""

    def __init__(self, unit: str, where: str, budget: CopyBudget) -> None:
        self.unit = unit
        """``bytes``, ``entries`` or ``stopped`` (the copy was abandoned: ``CopyBudget.stop``)."""
        self.where = where
        """The entry it stopped at, relative to the copy's root."""
        self.copied_bytes = budget.copied_bytes
        self.copied_entries = budget.copied_entries
        super().__init__(
            f"the copy stopped at {where} after {self.copied_bytes:,} bytes in"
            f" {self.copied_entries:,} entries: the next would pass its {unit} budget"
        )


class CopyBudget:
    """What a copy (a snapshot's or a fork's, its ``/tmp`` and its workspace together) may still
    write: bytes, as ``du`` counts them (each file's rounded up to ``BLOCK``, each directory one
    ``BLOCK``), and entries. Every copier charges it before it writes, so a tree larger than the
    budget is refused after at most the budget (and a block) was written, not after it was
    copied whole. One copier at a time uses it (the /tmp part, then the workspace part)."""

    def __init__(self, max_bytes: int, max_entries: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self.max_entries = max(0, max_entries)
        self.copied_bytes = 0
        self.copied_entries = 0
        self._stopped = False

    @property
    def bytes_left(self) -> int:
        return self.max_bytes - self.copied_bytes

    def entry(self, where: str, nbytes: int = 0) -> None:
        """Count one more entry taking ``nbytes`` (before rounding).

        Raises:
            CopyBudgetExceeded: it would pass either bound, or the copy was stopped.
        """
        if self._stopped:
            raise CopyBudgetExceeded("stopped", where, self)
        if self.copied_entries >= self.max_entries:
            raise CopyBudgetExceeded("entries", where, self)
        self.charge(where, nbytes)
        self.copied_entries += 1

    def charge(self, where: str, nbytes: int) -> None:
        """Count ``nbytes`` more (rounded up to ``BLOCK``) of the entry at ``where``.

        Raises:
            CopyBudgetExceeded: they would pass the byte bound, or the copy was stopped.
        """
        if self._stopped:
            raise CopyBudgetExceeded("stopped", where, self)
        rounded = -(-nbytes // BLOCK) * BLOCK
        if rounded > self.bytes_left:
            raise CopyBudgetExceeded("bytes", where, self)
        self.copied_bytes += rounded

    def stop(self) -> None:
        """The copy was abandoned (its caller was cancelled): its next charge raises, so a copy
        running in a thread ends at its next entry or chunk."""
        self._stopped = True


NO_HOOKS = ProviderHooks()
"""A backend nobody watches, stores or proxies for (tools run alone, unit tests)."""


class SandboxProvider(Protocol):
    """What a sandbox backend offers a server, declared once: a sandbox per session (created
    lazily, on first use), and its part in each session's life and in the server's.

    ``sandbox_for``, ``close_session`` and ``aclose`` every backend implements. Every other member
    is optional and declared here with what a backend without it does (nothing); a backend
    subclasses this class to inherit those defaults and overrides what it offers (the container
    backends: all of it). Nothing is probed: a caller calls what is declared.

    A provider is a listener of the session registry (``core/sessions/registry.py``): a session
    opened is ``session_created``, one given back is ``expect_container`` of its stored container.
    """

    observer: SandboxObserver = NO_SANDBOX_OBSERVER
    """Told of sandbox launches, launch failures and removals (metrics); from ``ProviderHooks``."""
    on_container: Callable[[str, str | None], None] | None = None
    """Told when a session's container changes; from ``ProviderHooks``."""
    egress: EgressGate | None = None
    """The server's egress proxy; from ``ProviderHooks``."""

    def take_hooks(self, hooks: ProviderHooks) -> None:
        """Keep what the server hands this backend; a backend's constructor calls it, once."""
        self.observer = hooks.observer
        self.on_container = hooks.on_container
        self.egress = hooks.egress

    def sandbox_for(self, session: Session) -> Sandbox:
        """The session's sandbox (nothing runs until its first use)."""
        ...

    async def close_session(self, session_id: str) -> None:
        """Stop and remove the session's sandbox; its workspace stays."""
        ...

    async def aclose(self) -> None:
        """Remove every sandbox this provider made and release what it holds."""
        ...

    # -- optional: a server's start and stop ----------------------------------------------------
    # (each default returns explicitly, so that a subclass need not override it)

    async def check_ready(self) -> None:
        """Fail at start, clearly, rather than on the first tool call (e.g. no daemon, no image).

        Raises:
            SandboxError: the backend cannot run sandboxes.
        """
        return None

    async def prepare_tenants(self, roots: Mapping[str, str]) -> None:
        """Before any workspace is made: per-tenant storage (tenant id -> workspace root)."""
        return None

    def expect_tenants(self, tenants: Mapping[str, tuple[int | None, int | None]]) -> None:
        """The configured tenants (id -> the uid, gid their sandboxes run as; None: the backend's
        user), in the config's order, for work a backend does ahead of their sessions."""
        return None

    async def remove_orphans(self) -> int:
        """Remove sandboxes a previous run left that no session owns or expects; returns how many."""
        return 0

    def expect_container(self, session: Session, container_id: str) -> None:
        """A restarted server gives ``session`` back: keep and re-adopt its stored container."""
        return None

    async def adopt_all(self) -> None:
        """Re-attach every expected container (in the background after a start)."""
        return None

    async def detach_all(self) -> None:
        """Let go of every sandbox without removing it (a stop that keeps the sessions)."""
        return None

    # -- optional: a session's life ------------------------------------------------------------

    def reserve_session_id(self, session: Session) -> str | None:
        """The id a new session (not yet open; its id a placeholder) should take instead, so that
        it gets a sandbox made ahead for that id (a warm pool's); None: keep its own."""
        return None

    def release_session_id(self, session_id: str) -> None:
        """A reserved id's session was never opened: let what was kept for it go."""
        return None

    def session_created(self, session: Session) -> None:
        """A new session was opened: a backend may start its sandbox now, in the background, so
        it is ready by the first call (it must not block or raise)."""
        return None

    async def pause(self, session_id: str) -> None:
        """Freeze the session's sandbox (its processes and /tmp kept, no CPU used); nothing if it
        has none running (here: nothing to freeze)."""
        return None

    async def resume(self, session_id: str, *, notice: str | None = None) -> None:
        """Thaw it; ``notice``: what the next call's result reports (``report_notice``). A sandbox
        that vanished meanwhile is handled as any vanished one: the next call starts a fresh one."""
        return None

    async def usage(self, session: Session) -> SessionUsage:
        """What the session's sandbox uses now (egress excluded: the server counts it).

        Raises:
            UsageUnsupported: this backend cannot measure it (here: none can be).
        """
        raise UsageUnsupported("this sandbox backend reports no usage per session")

    async def capture(
        self,
        session: Session,
        tmp_dest: str,
        copy_workspace: Callable[[], Awaitable[None]],
        budget: CopyBudget,
    ) -> bool:
        """With the session's sandbox held still (frozen, or already paused; no container
        launched meanwhile): copy its ``/tmp`` into the directory ``tmp_dest`` (made here),
        charging ``budget`` as it goes, then ``copy_workspace()`` (which charges the same
        budget); thawed after unless it was paused. False: no container ran, so there was no
        ``/tmp`` to copy (the workspace was copied all the same).

        Raises:
            SnapshotUnsupported: this backend cannot copy a sandbox's ``/tmp`` (here: none can).
            CopyBudgetExceeded: the copy would pass ``budget`` (it stopped there; the caller
                removes what it wrote).
        """
        raise SnapshotUnsupported("this sandbox backend cannot snapshot or fork a session")

    async def seed_tmp(self, session: Session, source: str) -> None:
        """Start the session's sandbox now, with the contents of the directory ``source`` copied
        into its ``/tmp`` before any command runs there (a session made from a snapshot or a
        fork); ``source`` may be removed once this returns.

        Raises:
            SnapshotUnsupported: this backend cannot (here: none can).
        """
        raise SnapshotUnsupported("this sandbox backend cannot start a session from a snapshot")

    async def working(self, session_id: str) -> bool:
        """True while processes that commands started still run in the session's sandbox (a
        background job is activity: its session does not expire by idleness); here: never."""
        return False

    # -- SessionListener ----------------------------------------------------------------------

    def session_opened(self, state: SessionState) -> None:
        self.session_created(state.session)

    def session_restored(self, state: SessionState, restored: Restoration) -> None:
        if restored.container_id:
            self.expect_container(state.session, restored.container_id)

    def session_closed(self, state: SessionState) -> None:
        """Nothing: the dispatcher removed the sandbox (``close_session``) before it was closed."""
        return None
