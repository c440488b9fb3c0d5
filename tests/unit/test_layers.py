"""The package's imports form layers (design §3): nothing imports upward and no modules import each
other in a circle. Every import counts, at module level, under ``TYPE_CHECKING`` or inside a function:
a cycle there is still two modules that cannot be understood or changed apart."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dispatcher"

LAYERS: dict[str, int] = {
    "dispatcher.trees": 0,  # a leaf utility (tar streams on the client side)
    "dispatcher.v1": 0,  # generated code of the contract
    "dispatcher.egress": 0,  # the egress proxy and its policy: stdlib only, below core and sandbox
    "dispatcher.core": 1,
    "dispatcher.config_base": 2,  # what every config section model shares (pydantic)
    "dispatcher.sandbox": 3,
    "dispatcher.tools": 3,  # the built-in tools, search/ (glob, grep) included: they share _common.py
    "dispatcher.mcp": 4,
    "dispatcher.observe_config": 5,
    "dispatcher.config": 6,
    "dispatcher.wire": 7,
    "dispatcher.server.requests": 8,  # what every server package knows of a request: errors, bounds
    "dispatcher.server.tenancy": 9,
    "dispatcher.server.persistence": 10,
    "dispatcher.server.observability": 10,
    "dispatcher.server.sessions.snapshots": 12,  # over the sessions' manager: it creates sessions to fill
    "dispatcher.server.sessions": 11,
    "dispatcher.server.preview": 12,  # the gateway and OpenPort's ports, under the transport
    "dispatcher.server.rpc": 13,  # the transport, on top: nothing in server/ below it imports it
    "dispatcher.server": 14,  # app.py (builds and wires it all), parts.py, restore.py, config_check.py, egress_wiring.py
    "dispatcher.client.base": 15,  # what the two clients share
    "dispatcher.client.ports": 16,  # ConnectPort's stream and the port-forward's listener
    "dispatcher.client.aio": 17,
    "dispatcher.client": 18,  # the blocking client and the package's public names
    "dispatcher.cli.output": 19,
    "dispatcher.cli.session": 20,
    "dispatcher.cli.trees": 20,
    "dispatcher.cli.config": 20,
    "dispatcher.mcp_server": 20,  # the MCP gateway: a gRPC client (client/) that asks as cli/output shows
    "dispatcher.cli": 21,  # main and the verbs (__init__), python -m (__main__)
}
"""Low to high: a module may import its own layer (no cycle) and those below, never above. A finer
entry comes before the package it refines: a module's layer is the first entry it falls under."""

ALLOWED_UPWARD = {
    ("dispatcher.cli", "_serve"),
    ("dispatcher.cli", "_run_server"),
    ("dispatcher.server.app", "_start_mcp_endpoint"),
}
"""``dispatcher serve`` starts the server: the one place a client-side module imports it, lazily.
The server starts its MCP endpoint, a gateway that is a gRPC client of it: the one place the server
imports a client-side module, lazily."""

FORBIDDEN_THIRD_PARTY = {
    "dispatcher.core": {"grpc", "docker", "yaml", "pydantic", "prometheus_client", "opentelemetry", "mcp"},
    "dispatcher.tools": {"grpc", "docker"},
    "dispatcher.wire": {"grpc", "docker", "yaml"},
    "dispatcher.config_base": {"grpc", "docker", "yaml"},
    "dispatcher.egress": {
        "grpc",
        "docker",
        "yaml",
        "pydantic",
        "prometheus_client",
        "opentelemetry",
        "mcp",
        "h11",
        "aiohttp",
    },
}


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int
    function: str | None


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}


def _imports(modules: dict[str, Path]) -> tuple[list[Import], list[Import]]:
    """(imports between our modules, imports of third-party top-level packages)."""
    ours: list[Import] = []
    third: list[Import] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        functions: dict[int, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    functions.setdefault(id(inner), node.name)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                subs = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in modules]
                targets = subs + ([module] if len(subs) < len(node.names) else [])
            for target in targets:
                entry = Import(name, target, getattr(node, "lineno", 0), functions.get(id(node)))
                if target == "dispatcher" or target.startswith("dispatcher."):
                    if target in modules and target != name:
                        ours.append(entry)
                else:
                    third.append(Import(name, target.split(".")[0], entry.line, entry.function))
    return ours, third


def _layer(module: str) -> tuple[str, int] | None:
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    return None


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in _modules() if m != "dispatcher" and _layer(m) is None)
    assert not missing, f"modules outside every layer (add them to LAYERS): {missing}"


def test_nothing_imports_a_higher_layer() -> None:
    ours, _ = _imports(_modules())
    upward = []
    for imp in ours:
        src, dst = _layer(imp.source), _layer(imp.target)
        if src is None or dst is None or dst[1] <= src[1] or dst[0] == src[0]:
            continue
        if (imp.source, imp.function) in ALLOWED_UPWARD:
            continue
        upward.append(f"{imp.source}:{imp.line} imports {imp.target} ({src[0]} is below {dst[0]})")
    same_rank = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in ours
        if (s := _layer(imp.source)) and (d := _layer(imp.target)) and s[0] != d[0] and s[1] == d[1]
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)
    assert not same_rank, "imports between packages of one layer:\n" + "\n".join(same_rank)


def test_no_third_party_package_where_a_layer_forbids_it() -> None:
    _, third = _imports(_modules())
    bad = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in third
        if (layer := _layer(imp.source)) and imp.target in FORBIDDEN_THIRD_PARTY.get(layer[0], ())
    ]
    assert not bad, "\n".join(bad)


CORE_LAYERS: dict[str, int] = {
    "dispatcher.core": 0,  # the foundation: the modules at core's top (types, blocks, errors, sandbox_api, ...)
    "dispatcher.core.text": 1,  # what a human is shown, redacted, cut; results fitted to a budget
    "dispatcher.core.events": 1,  # a session's event bus and the typed payloads it carries
    "dispatcher.core.staging": 1,  # review and audit sessions' writes kept off the disk
    "dispatcher.core.approval": 1,  # approval modes, the confirmation policy, a session's questions to a human
    "dispatcher.core.sessions": 2,  # a session's life: what it is and carries, its registry, its clocks
    "dispatcher.core.call": 3,  # one call through its steps, and the knobs they read
    "dispatcher.core.dispatcher": 4,  # ToolDispatcher: what outlives one call
    "dispatcher.core.transfer": 5,  # trees in and out of a session's workspace, through a dispatcher
}
"""Inside ``dispatcher.core``, low to high, by the rule of ``LAYERS``: a module imports its own
package and lower ranks, never a higher one nor a sibling of its rank. The longest entry that names
a module is its own: each package of core has a line, and so has a module at core's top that stands
above the packages; the rest of the top is the foundation."""

CORE_FACE = "dispatcher.core"
"""The package's ``__init__``: it names the public types of every rank (loaded lazily), so it stands
above them all and is not checked here."""

CORE_ALLOWED_UPWARD = {("dispatcher.core.provider_api", "dispatcher.core.sessions")}
"""(module, package) pairs that may import above their rank, each with its reason. The provider
surface's session-registry hooks are typed with a session, its state and its restoration (under
``TYPE_CHECKING``): the one arrow from the foundation up, until those hooks are declared apart from
the registry's types. The sandbox interface itself (``sandbox_api``) imports nothing above it."""


def _core_layer(module: str) -> tuple[str, int] | None:
    prefixes = [p for p in CORE_LAYERS if module == p or module.startswith(p + ".")]
    if not prefixes:
        return None
    prefix = max(prefixes, key=len)
    return prefix, CORE_LAYERS[prefix]


def test_every_package_of_core_has_a_rank() -> None:
    packages = {m for m, p in _modules().items() if m.startswith(CORE_FACE + ".") and p.name == "__init__.py"}
    missing = sorted(packages - CORE_LAYERS.keys())
    assert not missing, f"packages of core without a rank (add them to CORE_LAYERS): {missing}"


def test_core_packages_import_only_lower_ranks() -> None:
    ours, _ = _imports(_modules())
    bad: list[str] = []
    for imp in ours:
        src, dst = _core_layer(imp.source), _core_layer(imp.target)
        if imp.source == CORE_FACE or src is None or dst is None or src[0] == dst[0] or dst[1] < src[1]:
            continue
        if (imp.source, dst[0]) in CORE_ALLOWED_UPWARD:
            continue
        where = "above" if dst[1] > src[1] else "beside"
        bad.append(f"{imp.source}:{imp.line} imports {imp.target} ({dst[0]} is {where} {src[0]})")
    assert not bad, "imports against core's ranks:\n" + "\n".join(bad)


BACKEND_CLIENTS = {
    "dispatcher.sandbox.kubernetes": {"grpc", "docker"},
    "dispatcher.sandbox.docker": {"grpc", "kubernetes_asyncio", "aiohttp"},
    "dispatcher.sandbox.container": {"grpc", "docker", "kubernetes_asyncio", "aiohttp"},
}
"""Each sandbox backend talks to its own engine only: the Kubernetes one through the API server
(never a Docker daemon), the Docker one never through a cluster client; what both share talks to
neither."""


def test_each_sandbox_backend_keeps_to_its_own_client() -> None:
    _, third = _imports(_modules())
    bad = [
        f"{imp.source}:{imp.line} imports {imp.target}"
        for imp in third
        for package, forbidden in BACKEND_CLIENTS.items()
        if (imp.source == package or imp.source.startswith(package + ".")) and imp.target in forbidden
    ]
    assert not bad, "\n".join(bad)


BACKENDS = ("dispatcher.sandbox.docker", "dispatcher.sandbox.kubernetes")
"""The hosts of the container sandbox: siblings, each over ``CONTAINER``, neither over the other."""
CONTAINER = "dispatcher.sandbox.container"
"""What both hosts share: it imports neither of them."""
NO_BACKEND = ("dispatcher.config", "dispatcher.mcp", CONTAINER)
"""Packages that import no backend at all: the config reads the sections ``CONTAINER`` holds, MCP
servers in sandboxes go through the declared ``Sandbox.start_process``."""


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _backend_of(module: str) -> str | None:
    return next((b for b in BACKENDS if _in(module, b)), None)


def test_no_sandbox_backend_imports_another() -> None:
    ours, _ = _imports(_modules())
    bad = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in ours
        if (src := _backend_of(i.source)) and (dst := _backend_of(i.target)) and src != dst
    ]
    assert not bad, f"backends may share only {CONTAINER}:\n" + "\n".join(bad)


def test_config_mcp_and_the_container_package_import_no_backend() -> None:
    ours, _ = _imports(_modules())
    bad = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in ours
        if any(_in(i.source, p) for p in NO_BACKEND) and _backend_of(i.target)
    ]
    assert not bad, "\n".join(bad)


def test_the_backend_rules_see_the_backends() -> None:
    modules = _modules()
    assert all(any(_in(m, b) for m in modules) for b in (*BACKENDS, CONTAINER))
    ours, _ = _imports(modules)
    assert any(_backend_of(i.source) and _in(i.target, CONTAINER) for i in ours)


AGENT = "dispatcher.sandbox.agent"
"""The in-sandbox agent: runs in any image with python3, so it imports the standard library only."""
AGENT_PROTOCOL = f"{AGENT}.protocol"
"""The one module of the agent the host imports: the schema both ends share."""


def _in_agent(module: str) -> bool:
    return module == AGENT or module.startswith(AGENT + ".")


def test_the_agent_imports_only_the_standard_library_and_itself() -> None:
    ours, third = _imports(_modules())
    bad = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in ours
        if _in_agent(i.source) and not _in_agent(i.target)
    ]
    bad += [
        f"{i.source}:{i.line} imports {i.target} (not in the standard library)"
        for i in third
        if _in_agent(i.source) and i.target not in sys.stdlib_module_names
    ]
    assert not bad, "\n".join(bad)


def test_the_host_imports_only_the_agent_protocol() -> None:
    ours, _ = _imports(_modules())
    bad = [
        f"{i.source}:{i.line} imports {i.target}"
        for i in ours
        if not _in_agent(i.source) and _in_agent(i.target) and i.target != AGENT_PROTOCOL
    ]
    assert not bad, f"host code may import only {AGENT_PROTOCOL} of the agent:\n" + "\n".join(bad)


def test_no_import_cycle_between_modules() -> None:
    modules = _modules()
    ours, _ = _imports(modules)
    edges: dict[str, dict[str, int]] = {m: {} for m in modules}
    for imp in ours:
        edges[imp.source].setdefault(imp.target, imp.line)
    cycles = _cycles(edges)
    shown = [
        " -> ".join(f"{a} (line {edges[a][b]})" for a, b in zip(c, [*c[1:], c[0]], strict=True))
        + f" -> {c[0]}"
        for c in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(shown)


def _cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (as a path) per strongly connected component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:  # iterative Tarjan: no recursion limit on deep graphs
        nonlocal counter
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_path_in(component, edges) for component in components]


def _path_in(component: list[str], edges: dict[str, dict[str, int]]) -> list[str]:
    """A shortest cycle through the component's first module, for the message."""
    members = set(component)
    start = sorted(component)[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(edges[node]):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return sorted(component)


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []
