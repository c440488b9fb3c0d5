#!/usr/bin/env bash
# Everything a new machine needs before it can serve or test: the Python package with its dev
# extras, a Docker engine that answers, gVisor registered as a runtime, and the sandbox image.
# Each step is quick when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}

stamp=.bootstrap-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || ! "$PY" -c "import dispatcher, grpc, docker" 2>/dev/null; then
  "$PY" -m pip install -q --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi
# Per-tenant disk quotas are loop-mounted ext4 images (sandbox.workspace_quota): mkfs.ext4 and mount.
if [ "$(id -u)" = 0 ] && ! { command -v mkfs.ext4 && command -v mount && command -v losetup; } >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq e2fsprogs mount >/dev/null
fi
bash scripts/ensure-docker.sh
if [ -f scripts/ensure-runsc.sh ]; then bash scripts/ensure-runsc.sh; fi
bash sandbox_images/build.sh
# The Node.js example client is part of the suite (the polyglot claim is tested).
if command -v npm >/dev/null 2>&1 && [ ! -d examples/node/node_modules ]; then
  npm ci --prefix examples/node --no-audit --no-fund --loglevel=error
fi
