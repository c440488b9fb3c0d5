#!/usr/bin/env bash
# The gates every change passes before any test runs (make test and make check run this;
# .pre-commit-config.yaml runs the same commands at commit): lint, formatting, mypy --strict over
# the package, the tests and the benchmarks (pyproject's [tool.mypy] files), and the generated
# code's staleness. Every gate runs, so one run names every failure; the exit status is 1 if any
# failed. Needs the dev extra (bootstrap and make install install it).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

failed=()
gate() {
  local name=$1
  shift
  echo "gate: $name"
  "$@" || failed+=("$name")
}

gate "ruff check" "$PY" -m ruff check dispatcher tests bench
gate "ruff format" "$PY" -m ruff format --check dispatcher tests bench
gate "mypy --strict" "$PY" -m mypy --strict
gate "proto check" bash scripts/gen_proto.sh --check

if ((${#failed[@]})); then
  echo "gates failed:$(printf ' [%s]' "${failed[@]}")" >&2
  exit 1
fi
echo "gates: all passed"
