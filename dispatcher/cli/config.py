"""``dispatcher config-schema`` and ``dispatcher config-check``: the config file without a server."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


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
    print(f"{args.config}: valid ({tenants}, sandbox backend {config.sandbox_backend})")
    return 0
