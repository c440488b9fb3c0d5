#!/usr/bin/env bash
# Build the Go bench client (bench/go_client) offline and print the binary's path on stdout.
#
#   scripts/build_go_client.sh              install the toolchain if missing, generate, build
#   scripts/build_go_client.sh --no-install fail (exit 3) instead of installing a missing toolchain
#
# The Go module proxy is not needed: Go, protoc, its Go plugins and the grpc/protobuf libraries come
# from Debian packages (golang-go, protobuf-compiler, protoc-gen-go, protoc-gen-go-grpc,
# golang-google-grpc-dev, golang-google-protobuf-dev, golang-github-golang-protobuf-1-5-dev), and
# the client is built in GOPATH mode against /usr/share/gocode. The stubs are generated from proto/
# into a scratch GOPATH on every rebuild, never committed. Nothing is rebuilt when the binary was
# built from the same inputs (main.go, proto/, the toolchain's versions). DISPATCHER_GO_CLIENT_DIR:
# where it goes (default ~/.cache/dispatcher/go_client). A cold build takes about a minute (grpc-go
# compiled from source); a rebuild with Go's build cache warm, seconds.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
install=1
if [[ "${1:-}" == "--no-install" ]]; then install=0; fi
dir="${DISPATCHER_GO_CLIENT_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dispatcher/go_client}"
gocode=/usr/share/gocode
# grpc-go 1.33 marshals through github.com/golang/protobuf: its 1.3 package (Debian's default) cannot
# handle messages protoc-gen-go (APIv2) generates and panics; 1.5 wraps APIv2 (and replaces 1.3).
packages=(golang-go protobuf-compiler protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev
  golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev)
# The import path main.go uses for the stubs; also the module path in bench/go_client/go.mod.
pkg=dispatcher/bench/go_client

have_toolchain() {
  command -v go >/dev/null && command -v protoc >/dev/null && command -v protoc-gen-go >/dev/null \
    && command -v protoc-gen-go-grpc >/dev/null && [[ -d "$gocode/src/google.golang.org/grpc" ]] \
    && [[ -d "$gocode/src/google.golang.org/protobuf" ]] && [[ -f /usr/include/google/protobuf/timestamp.proto ]] \
    && [[ -f "$gocode/src/github.com/golang/protobuf/proto/registry.go" ]]  # 1.5, not 1.3
}

if ! have_toolchain; then
  if (( ! install )); then
    echo "build_go_client: no Go toolchain; install it with: apt-get install -y ${packages[*]}" >&2
    exit 3
  fi
  as_root=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then as_root=(sudo -n); else
      echo "build_go_client: not root; install the toolchain with: sudo apt-get install -y ${packages[*]}" >&2
      exit 3
    fi
  fi
  echo "build_go_client: installing ${packages[*]}" >&2
  if ! DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q --no-install-recommends \
    "${packages[@]}" >&2; then
    "${as_root[@]}" apt-get update -q >&2 || true
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q --no-install-recommends \
      "${packages[@]}" >&2 || { echo "build_go_client: apt-get install failed" >&2; exit 3; }
  fi
  have_toolchain || { echo "build_go_client: toolchain still incomplete after install" >&2; exit 3; }
fi

bin="$dir/go_client"
stamp="$dir/inputs.sha256"
inputs="$( (cat "$repo/bench/go_client/main.go"; find "$repo/proto" -name '*.proto' | LC_ALL=C sort | xargs cat;
  go version; protoc --version; dpkg-query -W "${packages[@]}" 2>/dev/null) | sha256sum | cut -d' ' -f1)"
mkdir -p "$dir"
# Several checkouts (and test runs) share the cache directory: one build at a time.
exec 9>"$dir/.lock"
flock 9
if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$inputs" ]]; then
  echo "$bin"
  exit 0
fi

gopath="$(mktemp -d "$dir/build.XXXXXX")"
trap 'rm -rf "$gopath"' EXIT
src="$gopath/src/$pkg"
mkdir -p "$src"
cp "$repo/bench/go_client/main.go" "$src/"

protos=()
while IFS= read -r f; do protos+=("${f#"$repo/proto/"}"); done \
  < <(find "$repo/proto/dispatcher/v1" -name '*.proto' | LC_ALL=C sort)
# proto/ sets no go_package (it would change the Python descriptors); M options map each file instead.
maps=()
for p in "${protos[@]}"; do maps+=("M$p=$pkg/dispatcherv1;dispatcherv1"); done
go_opt="$(IFS=,; echo "${maps[*]}")"
(cd "$repo/proto" && protoc -I. -I/usr/include --go_out="$gopath/src" --go-grpc_out="$gopath/src" \
  --go_opt="$go_opt" --go-grpc_opt="$go_opt" "${protos[@]}") >&2

# GOPATH mode: the Debian libraries are a GOPATH tree; nothing is fetched (GOPROXY=off).
(cd "$src" && GO111MODULE=off GOPATH="$gopath:$gocode" GOPROXY=off GOFLAGS= \
  go build -trimpath -o "$gopath/go_client" .) >&2
mv "$gopath/go_client" "$bin"
echo "$inputs" >"$stamp"
echo "$bin"
