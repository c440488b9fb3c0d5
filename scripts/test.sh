#!/usr/bin/env bash
# The one command that runs the whole suite on any machine: bootstrap, then pytest.
# Docker tests are required here (DISPATCHER_REQUIRE_DOCKER=1): a missing daemon fails, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# The Go client (tests/server/test_go_client.py): Debian's toolchain, about a minute when cold.
bash scripts/build_go_client.sh >/dev/null
export DISPATCHER_REQUIRE_DOCKER=1
exec "${PY:-python3}" -m pytest -q -p no:cacheprovider "$@"
