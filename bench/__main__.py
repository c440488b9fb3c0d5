"""``python3 -m bench``: measure everything in one run and print one markdown table.

Measuring modules are tried in order; each is ``async def measure(env: BenchEnv) -> list[Row]``.
A module that is missing (``bench.grpc_bench`` until the server lands) is skipped; one that
fails adds a row saying so, and the rest still run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import sys
import tempfile
import time
import traceback
from pathlib import Path

import docker

from bench.env import BenchEnv
from bench.table import Row, print_table

MODULES = (
    "bench.baselines",
    "bench.sandbox_bench",
    "bench.grpc_bench",
    "bench.go_client_bench",
    "bench.mcp_bench",
    "bench.metrics_bench",
    "bench.isolation_bench",
    "bench.trees_bench",
    "bench.caller_output_bench",
    "bench.memory_bench",
    "bench.search_bench",
    "bench.restart_bench",
    "bench.egress_bench",
    "bench.lifecycle_bench",
    "bench.egress_flood_bench",
    "bench.density_bench",
    "bench.pool_bench",
    "bench.kubernetes_bench",
    "bench.process_bench",
    "bench.run_code_bench",
    "bench.snapshot_bench",
    "bench.preview_bench",
)


async def collect(env: BenchEnv, modules: tuple[str, ...] = MODULES) -> list[Row]:
    """Rows of every available measuring module, in order."""
    rows: list[Row] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        started = time.monotonic()
        try:
            rows.extend(await module.measure(env))
        except Exception as exc:
            traceback.print_exc()
            rows.append(
                Row(name.removeprefix("bench."), "(module failed)", None, note=f"{type(exc).__name__}: {exc}")
            )
        print(f"bench: {name} took {time.monotonic() - started:.1f}s", file=sys.stderr)
    return rows


def sweep(instance: str) -> None:
    """Remove any container the run left behind (all carry its instance label)."""
    client = docker.from_env()
    try:
        # The low-level list: the high-level one inspects each container and fails on one that a
        # stopping server removes meanwhile (a thousand of them take a while).
        for entry in client.api.containers(all=True, filters={"label": f"dispatcher.instance={instance}"}):
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_container(entry["Id"], force=True)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument(
        "--only", metavar="NAME", action="append", help="run only these modules (e.g. grpc_bench); repeatable"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dispatcher-bench-") as scratch:
        path = Path(scratch)
        path.chmod(0o755)
        env = (
            BenchEnv(
                path,
                warm_iterations=30,
                docker_iterations=5,
                cold_iterations=2,
                concurrency_sessions=10,
                density_sessions=6,
                pool_sessions=20,
                restart_large_sessions=40,
            )
            if args.quick
            else BenchEnv(path)
        )
        started = time.monotonic()
        try:
            modules = (
                MODULES
                if not args.only
                else tuple(m for m in MODULES if m.removeprefix("bench.") in args.only)
            )
            rows = asyncio.run(collect(env, modules))
        finally:
            try:
                sweep(env.instance)
            except Exception as exc:  # the table is still worth printing
                print(f"bench: the sweep of the run's containers failed: {exc!r}", file=sys.stderr)
        print_table(rows)
        print(
            f"\n({time.monotonic() - started:.0f} s, one run; ratios are against the docker exec row above)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
