#!/usr/bin/env bash
# Generate dispatcher/v1/*_pb2.py, *_pb2_grpc.py and their .pyi stubs from proto/.
#
#   scripts/gen_proto.sh          regenerate in place
#   scripts/gen_proto.sh --check  regenerate into a temp dir and fail if the committed code differs
#
# Needs grpcio-tools and mypy-protobuf (the `dev` extra). Imports between generated modules are
# rewritten to be package-relative, so dispatcher.v1 works wherever the package is installed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-python3}"
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

if ! "$PY" -c 'import grpc_tools.protoc, mypy_protobuf.main' 2>/dev/null; then
  echo "gen_proto.sh: $PY has no grpcio-tools or mypy-protobuf: install the dev extra (make install)" >&2
  exit 1
fi
wkt="$("$PY" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')"
# protoc runs mypy-protobuf's plugins with this Python, not whatever protoc-gen-mypy comes first on
# PATH: pip may put its scripts outside PATH (a --user install), and another environment's copy of
# another version writes other stubs, which --check would report as stale.
pyexe="$("$PY" -c 'import sys; print(sys.executable)')"
plugin() {  # plugin NAME FUNCTION: an executable protoc-gen-NAME running mypy_protobuf.main.FUNCTION
  printf '#!/bin/sh\nexec "%s" -c "from mypy_protobuf.main import %s; %s()"\n' "$pyexe" "$2" "$2" \
    >"$out/protoc-gen-$1"
  chmod +x "$out/protoc-gen-$1"
  echo "--plugin=protoc-gen-$1=$out/protoc-gen-$1"
}
plugins=("$(plugin mypy main)" "$(plugin mypy_grpc grpc)")
protos=()
while IFS= read -r f; do protos+=("${f#"$repo/proto/"}"); done \
  < <(find "$repo/proto/dispatcher/v1" -name '*.proto' | LC_ALL=C sort)

(cd "$repo/proto" && "$PY" -m grpc_tools.protoc -I. -I"$wkt" \
  --python_out="$out" --grpc_python_out="$out" \
  "${plugins[@]}" \
  --mypy_out="$out" --mypy_grpc_out="$out" "${protos[@]}") >"$out/protoc.log" 2>&1 \
  || { cat "$out/protoc.log" >&2; exit 1; }

gen="$out/dispatcher/v1"
# `from dispatcher.v1 import x_pb2 as ...` -> `from . import x_pb2 as ...` (code and stubs)
sed -i -E 's/^from dispatcher\.v1 import /from . import /' "$gen"/*.py "$gen"/*.pyi
cat > "$gen/__init__.py" <<'PY'
"""Generated gRPC code for proto/dispatcher/v1 (scripts/gen_proto.sh). Do not edit."""
PY

dest="$repo/dispatcher/v1"
if (( check )); then
  if ! diff -ru --exclude='__pycache__' "$gen" "$dest" >/dev/null 2>&1; then
    echo "dispatcher/v1 is stale: run 'make proto' and commit the result" >&2
    diff -ru --exclude='__pycache__' "$gen" "$dest" | head -40 >&2 || true
    exit 1
  fi
  echo "dispatcher/v1 is up to date"
else
  mkdir -p "$dest"
  find "$dest" -maxdepth 1 -type f \( -name '*_pb2*.py' -o -name '*_pb2*.pyi' -o -name '__init__.py' \) -delete
  cp "$gen"/* "$dest"/
  echo "generated: $(cd "$dest" && ls | tr '\n' ' ')"
fi
