"""``dispatcher config-schema`` and ``dispatcher config-check``: the config file without a server."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dispatcher.config.load import Config


def add_verbs(verbs: Any) -> None:
    """Add ``config-schema`` and ``config-check`` to the CLI's sub-parsers."""
    schema = verbs.add_parser(
        "config-schema",
        help="print the JSON Schema of the config file (docs/config.schema.json)",
        description="Print the JSON Schema (2020-12) of `dispatcher serve --config FILE`, for editors "
        "and linters. Checks the schema cannot express (tenants' ids, tokens, uids and workspace roots "
        "are their own; the result budget fits the message limit) are made by config-check and serve.",
    )
    schema.set_defaults(func=_schema)
    check = verbs.add_parser(
        "config-check",
        help="validate a config file as serve would, without starting (exit 2 naming each bad key)",
        description="Validate FILE with the checks `dispatcher serve --config FILE` runs before it "
        "starts, reporting every problem at once: every key, the checks across keys, the TLS files, "
        "the tool registry built (built-in and custom tools; their modules are imported, as serve "
        "does), every tool name in timeouts, tool_confirmation (per_tool, always_prompt, "
        "modes.*.per_tool) and tenants[].tools, and fs grants inside the workspace. MCP servers are "
        "not started: a name mcp_<server>_<tool> of a configured server is accepted here and checked "
        "by serve once the server lists its tools. Nothing is written; Docker is contacted only with "
        "--images.",
    )
    check.add_argument("config", metavar="FILE")
    check.add_argument(
        "--show-pod",
        action="store_true",
        help="also print (YAML) the Pod, workspace PVC and NetworkPolicy (and the egress CA "
        "bundle's ConfigMap) the kubernetes backend would create for a session of the first "
        "tenant, for review",
    )
    check.add_argument(
        "--images",
        action="store_true",
        help="also run serve's sandbox preflight: the Docker daemon answers and the configured image "
        "exists, has python and this server's agent, and does not run as root",
    )
    check.set_defaults(func=_check)


def schema_text() -> str:
    """What ``config-schema`` prints: the schema as indented JSON, ending in a newline."""
    from dispatcher.config.file import config_schema

    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"


def _schema(args: argparse.Namespace) -> int:
    sys.stdout.write(schema_text())
    return 0


def _check(args: argparse.Namespace) -> int:
    """Raises ConfigError (main prints it and exits 2) with every problem, one per line."""
    from dispatcher.config.load import load_config
    from dispatcher.core.errors import ConfigError
    from dispatcher.core.registry import ToolRegistry
    from dispatcher.server.config_check import check_served_config

    problems: list[str] = []
    config = load_config(args.config, problems=problems)
    try:
        check_served_config(config, ToolRegistry())
    except ConfigError as exc:
        problems.extend(str(exc).splitlines())
    if args.images:
        problems.extend(_images(config))
    if problems:
        raise ConfigError("\n".join(problems))
    tenants = f"{len(config.tenants)} tenant(s)" if config.tenants else "the single default tenant"
    if getattr(args, "show_pod", False):
        sys.stdout.write(pod_review(config))
        return 0
    images = ""
    if args.images:
        images = ", image checked" if config.sandbox_backend == "docker" else ", no image to check"
    print(f"{args.config}: valid ({tenants}, sandbox backend {config.sandbox_backend}{images})")
    return 0


def _images(config: Any) -> list[str]:
    """serve's preflight of the sandbox (``provider.check_ready``), its refusal as a problem."""
    import asyncio

    from dispatcher.server.app import make_provider
    from dispatcher.server.config_check import check_images

    if config.sandbox_backend != "docker":
        return []

    async def run() -> list[str]:
        provider = make_provider(config)
        try:
            return await check_images(config, provider)
        finally:
            await provider.aclose()

    return asyncio.run(run())


def pod_review(config: Config) -> str:
    """The manifests the kubernetes backend would create for an example session, as YAML documents.

    The session is the first tenant's (its uid and gid; the first of ``tenant_uids`` when it has
    none, as the allocation starts there), on a workspace named ``example``; with its
    ``egress.ca_bundle``, the ConfigMap holding it too.
    """
    import yaml

    from dispatcher.core.errors import ConfigError
    from dispatcher.core.sandbox_api import SandboxError
    from dispatcher.core.sessions.session import Session
    from dispatcher.sandbox.docker.backend import instance_id_for
    from dispatcher.sandbox.kubernetes.ca import configmap_manifest, read_bundle
    from dispatcher.sandbox.kubernetes.manifests import (
        label_value,
        network_policy_manifest,
        pod_manifest,
        pod_name,
        pvc_manifest,
    )

    tenant = config.tenants[0] if config.tenants else None
    uid = tenant.uid if tenant is not None else None
    gid = tenant.gid if tenant is not None else None
    if uid is None and config.tenant_uids is not None:
        uid = config.tenant_uids.start
    session = Session(
        session_id="example-session",
        workspace_path=str(config.home / "workspaces" / "example"),
        tenant_id=tenant.tenant_id if tenant is not None else "default",
        workspace_root=str(config.home / "workspaces"),
        workspace_name="example",
        sandbox_uid=uid,
        sandbox_gid=gid,
    )
    instance = config.sandbox.instance or instance_id_for(str(config.home))
    name = pod_name(instance, session.session_id)
    bundle = (tenant.egress if tenant is not None else config.egress).ca_bundle
    ca = None
    if bundle is not None:
        try:
            data = read_bundle(bundle)
        except SandboxError as exc:
            raise ConfigError(str(exc)) from None
        ca = configmap_manifest(
            config.kubernetes.namespace, instance, data, instance_label=label_value(instance)
        )
    ca_name = ca["metadata"]["name"] if ca is not None else None
    docs = [
        pod_manifest(config.sandbox, config.kubernetes, session, instance=instance, name=name, ca=ca_name),
        pvc_manifest(config.sandbox, config.kubernetes, session),
        network_policy_manifest(config.kubernetes.namespace),
        *([ca] if ca is not None else []),
    ]
    header = f"# {config.source}: valid; what sandbox.backend: kubernetes creates for one session\n"
    return header + yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
