#!/usr/bin/env bash
# Build the sandbox images offline (no registry is reachable here: never `docker pull`).
#
#   dispatcher-base:bookworm        Debian bookworm minbase + python3, from debootstrap + docker import
#   dispatcher-sandbox:<hash>       base + agent + sandbox user + /workspace; also tagged :latest
#   dispatcher-busybox:latest       FROM scratch + busybox-static: a python-less image for tests of the
#                                   docker-exec fallback path
#
# Idempotent and quick when nothing changed: the base is built only if missing, the agent layer is
# tagged by a hash of every input (Dockerfile, agent.py, uid/gid, base image id) and skipped if present.
#
# Environment:
#   SANDBOX_UID / SANDBOX_GID   uid/gid of the in-sandbox user (default 1000/1000; see README.md)
#   DEBIAN_MIRROR               debootstrap mirror (default: the first non-security apt source)
#   REBUILD_BASE=1              force a new debootstrap
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
agent_src="$repo/dispatcher/sandbox/agent/agent.py"

BASE_IMAGE="${BASE_IMAGE:-dispatcher-base:bookworm}"
SANDBOX_REPO="${SANDBOX_REPO:-dispatcher-sandbox}"
BUSYBOX_IMAGE="${BUSYBOX_IMAGE:-dispatcher-busybox:latest}"
SANDBOX_UID="${SANDBOX_UID:-1000}"
SANDBOX_GID="${SANDBOX_GID:-1000}"
# The machine's own apt source is the mirror it is known to reach.
apt_mirror() {
  local uri
  uri="$(grep -hoE '^(URIs:|deb) +[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
    | awk '{print $2}' | grep -v -- '-security' | head -n1 || true)"
  printf '%s' "${uri%/}"
}
DEBIAN_MIRROR="${DEBIAN_MIRROR:-$(apt_mirror)}"
# The legacy builder needs no buildx plugin and honours --network=none.
export DOCKER_BUILDKIT=0

log() { printf 'images: %s\n' "$*" >&2; }

# Quiet on success (the legacy builder prints a deprecation banner); everything on failure.
quiet_build() {
  local out
  if ! out="$(docker build -q --network=none "$@" 2>&1)"; then
    printf '%s\n' "$out" >&2
    return 1
  fi
}

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# Debian packages this script needs, installed on first use (a fresh machine has neither).
apt_install() {
  [[ "$(id -u)" == 0 ]] || { log "need root to apt-get install $*"; return 1; }
  export DEBIAN_FRONTEND=noninteractive
  if [[ -z "${_apt_updated:-}" ]]; then apt-get update -qq; _apt_updated=1; fi
  apt-get install -y -qq "$@" >/dev/null
}

build_base() {
  if have_image "$BASE_IMAGE" && [[ "${REBUILD_BASE:-0}" != 1 ]]; then
    log "$BASE_IMAGE present, skipping debootstrap"
    return
  fi
  command -v debootstrap >/dev/null || apt_install debootstrap \
    || { log "debootstrap is missing (apt-get install debootstrap)"; exit 1; }
  local root
  root="$(mktemp -d /tmp/dispatcher-rootfs.XXXXXX)"
  # shellcheck disable=SC2064
  trap "rm -rf '$root'" EXIT
  log "debootstrap bookworm into $root (about a minute)"
  # python3 (not python3-minimal): the agent needs json, which -minimal lacks.
  debootstrap --variant=minbase --include=python3 bookworm "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >/dev/null
  # Package caches and lists are dead weight in a read-only sandbox.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["/bin/sh"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$root"
  trap - EXIT
  log "imported $BASE_IMAGE"
}

build_sandbox() {
  [[ -f "$agent_src" ]] || { log "missing $agent_src"; exit 1; }
  local base_id hash tag ctx
  base_id="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"
  hash="$( { cat "$here/Dockerfile" "$agent_src"; echo "$SANDBOX_UID:$SANDBOX_GID:$base_id"; } \
    | sha256sum | cut -c1-16)"
  tag="$SANDBOX_REPO:$hash"
  if have_image "$tag"; then
    log "$tag present (inputs unchanged)"
  else
    ctx="$(mktemp -d /tmp/dispatcher-ctx.XXXXXX)"
    cp "$here/Dockerfile" "$agent_src" "$ctx/"
    log "building $tag"
    quiet_build \
      --build-arg "BASE=$BASE_IMAGE" \
      --build-arg "SANDBOX_UID=$SANDBOX_UID" --build-arg "SANDBOX_GID=$SANDBOX_GID" \
      --label "dispatcher.inputs=$hash" \
      -t "$tag" "$ctx"
    rm -rf "$ctx"
  fi
  docker tag "$tag" "$SANDBOX_REPO:latest"
  log "$SANDBOX_REPO:latest -> $tag"
  # Older content-hash tags are dead weight; one still used by a container simply stays.
  docker images --format '{{.Repository}}:{{.Tag}}' "$SANDBOX_REPO" \
    | grep -v -e ":latest$" -e ":$hash$" | xargs -r docker rmi >/dev/null 2>&1 || true
}

build_busybox() {
  local bb=/bin/busybox ctx
  if have_image "$BUSYBOX_IMAGE"; then
    log "$BUSYBOX_IMAGE present"
    return
  fi
  # Debian's busybox-static is a static binary; the dynamic `busybox` package would not run FROM scratch.
  if ! dpkg -s busybox-static >/dev/null 2>&1 && ! apt_install busybox-static; then
    log "busybox-static not installable; skipping $BUSYBOX_IMAGE"
    return
  fi
  ctx="$(mktemp -d /tmp/dispatcher-bb.XXXXXX)"
  cp "$bb" "$ctx/busybox"
  cat >"$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/busybox", "mkdir", "-p", "/workspace", "/tmp", "/etc"]
# Docker's tmpfs at /tmp takes the mode of the directory it covers.
RUN ["/bin/busybox", "chmod", "1777", "/tmp"]
RUN ["/bin/sh", "-c", "echo 'sandbox:x:1000:1000::/tmp:/bin/sh' > /etc/passwd && echo 'sandbox:x:1000:' > /etc/group"]
WORKDIR /workspace
DOCKERFILE
  quiet_build -t "$BUSYBOX_IMAGE" "$ctx"
  rm -rf "$ctx"
  log "built $BUSYBOX_IMAGE"
}

case "${1:-all}" in
  base) build_base ;;
  sandbox) build_base; build_sandbox ;;
  busybox) build_busybox ;;
  all) build_base; build_sandbox; build_busybox ;;
  *) echo "usage: $0 [all|base|sandbox|busybox]" >&2; exit 2 ;;
esac
