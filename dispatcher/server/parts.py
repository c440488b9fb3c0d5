"""The parts of the service made from the config alone, before any server holds them: the sandbox
backend the config asks for (``make_provider``, which ``config-check`` also makes) and the core
dispatcher over it with the config's tools (``build_dispatcher``), the sandboxes' default ids
(``default_ids``) and tree transfers within the server's bounds (``tree_transfers``). ``app.py``
wires them."""

from __future__ import annotations

from collections.abc import Callable

from dispatcher.config.load import Config
from dispatcher.config.sections import ServerOptions
from dispatcher.core.audit import AuditSink
from dispatcher.core.dispatcher import ToolDispatcher
from dispatcher.core.observe import NO_OBSERVER, CallObserver
from dispatcher.core.provider_api import NO_HOOKS, ProviderHooks, SandboxProvider
from dispatcher.core.registry import ToolRegistry
from dispatcher.core.sessions.expiry import LifecycleHooks
from dispatcher.core.transfer import TransferLimits, TreeTransfers
from dispatcher.sandbox.transfer import AgentTreeTransport
from dispatcher.server.config_check import check_served_config
from dispatcher.server.tenancy.tenants import DefaultIds, default_sandbox_ids

ProviderFactory = Callable[[ProviderHooks], SandboxProvider]
"""Makes the server's sandbox backend with what the server hands it (``make_provider``'s shape)."""


def make_provider(config: Config, hooks: ProviderHooks = NO_HOOKS) -> SandboxProvider:
    """The sandbox backend the config asks for, made with ``hooks`` (a server's metrics, stored
    containers and egress proxy).

    Raises:
        ConfigError: the backend's own validation failed.
    """
    if config.sandbox_backend == "local":
        from dispatcher.sandbox.local import LocalSandboxProvider

        return LocalSandboxProvider(hooks=hooks, process_limits=config.sandbox.processes)
    from dispatcher.sandbox.docker.backend import DockerSandboxProvider, instance_id_for

    if config.sandbox_backend == "kubernetes":
        from dispatcher.sandbox.kubernetes.backend import KubernetesSandboxProvider

        return KubernetesSandboxProvider(
            config.sandbox, config.kubernetes, instance=instance_id_for(str(config.home)), hooks=hooks
        )

    # The instance label follows the state directory, so a restarted server finds its orphans.
    return DockerSandboxProvider(
        config.sandbox,
        instance=instance_id_for(str(config.home)),
        state_dir=str(config.home),
        hooks=hooks,
    )


def build_dispatcher(
    config: Config,
    provider: SandboxProvider,
    *,
    audit: AuditSink | None = None,
    observer: CallObserver = NO_OBSERVER,
    lifecycle: LifecycleHooks | None = None,
    registry: ToolRegistry | None = None,
) -> ToolDispatcher:
    """The core dispatcher with the built-in tools and the config's custom tools registered, the
    config checked against them as ``config-check`` does (``config_check.check_served_config``).

    Raises:
        ConfigError: every problem, one per line.
    """
    if registry is None:
        registry = ToolRegistry()
        check_served_config(config, registry)
    return ToolDispatcher(
        provider,
        config=config.dispatcher,
        policy=config.policy,
        audit=audit,
        observer=observer,
        lifecycle=lifecycle,
        registry=registry,
    )


def default_ids(config: Config) -> DefaultIds | None:
    """Docker sandboxes without a tenant uid: the owner of the workspace root, or sandbox.user."""
    if config.sandbox_backend != "docker":
        return None
    sandbox = config.sandbox
    configured = None
    if sandbox.uid is not None:
        configured = (sandbox.uid, sandbox.gid if sandbox.gid is not None else sandbox.uid)
    return default_sandbox_ids(sandbox.user if "user" in sandbox.model_fields_set else None, configured)


def tree_transfers(dispatcher: ToolDispatcher, opts: ServerOptions) -> TreeTransfers:
    """Tree uploads and downloads through the sandboxes' agents, within the server's bounds."""
    limits = TransferLimits(
        max_upload_bytes=opts.max_upload_bytes,
        max_upload_files=opts.max_upload_files,
        max_download_bytes=opts.max_download_bytes,
    )
    return TreeTransfers(dispatcher, AgentTreeTransport(), limits)
