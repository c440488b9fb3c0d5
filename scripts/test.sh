#!/usr/bin/env bash
# The one command that runs the whole suite on any machine: bootstrap, the gates (lint, format,
# mypy --strict, the proto check: scripts/gates.sh), then pytest. A failed gate fails the run.
# Docker tests are required here (DISPATCHER_REQUIRE_DOCKER=1): a missing daemon fails, never skips.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/gates.sh
# The Go client (tests/server/clients/test_go_client.py): Debian's toolchain, about a minute when cold. A
# failure here does not stop the suite: that test module builds it again and fails (or, with no
# toolchain to be had, skips) saying why.
bash scripts/build_go_client.sh >/dev/null || echo "make test: the Go client was not built (see above)" >&2
export DISPATCHER_REQUIRE_DOCKER=1
if [ "$#" -gt 0 ]; then
  exec "${PY:-python3}" -m pytest -q -p no:cacheprovider "$@"
fi
"${PY:-python3}" -m pytest -q -p no:cacheprovider
# The isolation tests once more with a warm pool of 2 behind every provider, so sessions adopt
# pooled containers (made ahead, workspace mounted through a slot) as well as launching their own.
echo "make test: the isolation tests again, with a warm pool (DISPATCHER_TEST_WARM_POOL=2)"
DISPATCHER_TEST_WARM_POOL=2 exec "${PY:-python3}" -m pytest -q -p no:cacheprovider \
  tests/integration/test_docker_escapes.py tests/integration/test_workspace_isolation.py \
  tests/integration/grpc/test_workspace_isolation.py tests/integration/test_docker_hostile_names.py \
  tests/integration/test_docker_adopt.py tests/integration/test_docker_pool.py
