#!/usr/bin/env bash
# The one command that runs the whole suite on any machine: bootstrap, then pytest.
# Docker tests are required here (DISPATCHER_REQUIRE_DOCKER=1): a missing daemon fails, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# The Go client (tests/server/test_go_client.py): Debian's toolchain, about a minute when cold. A
# failure here does not stop the suite: that test module builds it again and fails (or, with no
# toolchain to be had, skips) saying why.
bash scripts/build_go_client.sh >/dev/null || echo "make test: the Go client was not built (see above)" >&2
export DISPATCHER_REQUIRE_DOCKER=1
exec "${PY:-python3}" -m pytest -q -p no:cacheprovider "$@"
