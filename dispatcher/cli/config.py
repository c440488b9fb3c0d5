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
        description="Validate FILE as `dispatcher serve --config FILE` would before it starts: every "
        "key, the checks across keys, the TLS files, and the custom tools (their modules are "
        "imported, as serve does). Nothing is written; Docker and MCP servers are not contacted.",
    )
    check.add_argument("config", metavar="FILE")
    check.add_argument(
        "--show-pod",
        action="store_true",
        help="also print (YAML) the Pod, workspace PVC and NetworkPolicy the kubernetes backend "
        "would create for a session of the first tenant, for review",
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
    """Raises ConfigError (main prints it and exits 2) when the file is not valid."""
    from dispatcher.config.load import load_config
    from dispatcher.server.app import load_tool_factory

    config = load_config(args.config)
    for i, spec in enumerate(config.custom_tools):
        load_tool_factory(spec, f"tools[{i}]")
    tenants = f"{len(config.tenants)} tenant(s)" if config.tenants else "the single default tenant"
    if getattr(args, "show_pod", False):
        sys.stdout.write(pod_review(config))
        return 0
    print(f"{args.config}: valid ({tenants}, sandbox backend {config.sandbox_backend})")
    return 0


def pod_review(config: Config) -> str:
    """The manifests the kubernetes backend would create for an example session, as YAML documents.

    The session is the first tenant's (its uid and gid; the first of ``tenant_uids`` when it has
    none, as the allocation starts there), on a workspace named ``example``.
    """
    import yaml

    from dispatcher.core.session import Session
    from dispatcher.sandbox.docker.backend import instance_id_for
    from dispatcher.sandbox.kubernetes.manifests import (
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
    docs = [
        pod_manifest(config.sandbox, config.kubernetes, session, instance=instance, name=name),
        pvc_manifest(config.sandbox, config.kubernetes, session),
        network_policy_manifest(config.kubernetes.namespace),
    ]
    header = f"# {config.source}: valid; what sandbox.backend: kubernetes creates for one session\n"
    return header + yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
