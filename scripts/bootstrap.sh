#!/usr/bin/env bash
# Everything a new machine needs before it can serve or test: the Python package with its dev
# extra (the gates' tools among them), a Docker engine that answers, gVisor registered as a
# runtime, and the sandbox image.
# Each step is quick when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

stamp=.bootstrap-installed
# Asked from outside the checkout, so an install of another (moved, removed) checkout is seen as
# such: the `dispatcher` command would import that one, or nothing.
installed=$(cd / && "$PY" -c "import os, dispatcher, grpc, docker, mcp, prometheus_client, opentelemetry.sdk
import grpc_tools, mypy_protobuf, mypy, ruff  # the dev extra: what scripts/gates.sh runs
print(os.path.dirname(os.path.dirname(os.path.realpath(dispatcher.__file__))))" 2>/dev/null || true)
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$installed" != "$(pwd -P)" ]; then
  # The same extras as `make install`: pyproject's `dev` says what a developer or CI needs.
  "$PY" -m pip install -q --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi
# Per-tenant disk quotas are loop-mounted ext4 images (sandbox.workspace_quota): mkfs.ext4 and mount.
if [ "$(id -u)" = 0 ] && ! { command -v mkfs.ext4 && command -v mount && command -v losetup; } >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs mount >/dev/null
fi
# The port-forward test fetches through the forward with curl, and the preview test drives a real
# headless Chromium (tests/server/ports).
if [ "$(id -u)" = 0 ] && ! { command -v curl && command -v chromium; } >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends curl chromium >/dev/null
fi
# The metrics test scrapes with a real Prometheus. Installed only (never started as a service:
# policy-rc.d refuses the package's start, and the test runs its own on loopback).
if [ "$(id -u)" = 0 ] && ! command -v prometheus >/dev/null 2>&1; then
  made_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [ -n "$made_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi
  # On a systemd machine the unit is enabled for the next boot: keep it from binding :9090 then.
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now prometheus >/dev/null 2>&1 || true; fi
fi
bash scripts/ensure-docker.sh
if [ -f scripts/ensure-runsc.sh ]; then bash scripts/ensure-runsc.sh; fi
bash scripts/ensure-kubectl-debian.sh
bash sandbox_images/build.sh
# The Node.js example client is part of the suite (the polyglot claim is tested).
if command -v npm >/dev/null 2>&1 && [ ! -d examples/node/node_modules/@modelcontextprotocol/sdk ]; then
  npm ci --prefix examples/node --no-audit --no-fund --loglevel=error
fi
