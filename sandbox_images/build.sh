#!/usr/bin/env bash
# Build the sandbox images offline (no registry is reachable here: never `docker pull`).
#
#   dispatcher-base:bookworm-<variant>-<hash>  Debian bookworm minbase + packages/<variant>.txt, from
#                                   debootstrap (+ bookworm-security updates) and docker import; the
#                                   hash is of the package list, so editing the list rebuilds the base
#   dispatcher-sandbox:<hash>       default base + agent.pyz + sandbox user + /workspace; also :latest
#   dispatcher-sandbox:minimal-<hash>  the same on the minimal base (python3 only); also :minimal
#   dispatcher-busybox:latest       FROM scratch + busybox-static: a python-less image for tests of the
#                                   docker-exec fallback path
#
# Idempotent and quick when nothing changed: a base is built only if its tag is missing, the agent
# layer is tagged by a hash of every input (Dockerfile, the agent package's modules, uid/gid, base
# image id) and skipped if present. The agent (dispatcher/sandbox/agent/, stdlib only) goes into the
# image as one zipapp, /opt/dispatcher/agent.pyz, run as `python3 -I /opt/dispatcher/agent.pyz`.
#
#   build.sh agent [OUT]            only pack the agent into OUT (default ./agent.pyz), e.g. for a
#                                   custom image that is not built FROM dispatcher-sandbox
#
# Environment:
#   SANDBOX_UID / SANDBOX_GID   uid/gid of the in-sandbox user (default 1000/1000; see README.md)
#   DEBIAN_MIRROR               debootstrap mirror (default: the machine's apt source for bookworm)
#   DEBIAN_SECURITY_MIRROR      mirror of bookworm-security (default: the machine's apt source with a
#                               -security suite; none there, or "none": the base has no security updates)
#   REBUILD_BASE=1              force a new debootstrap
#   SANDBOX_REPO                repository of the sandbox images (default dispatcher-sandbox; both
#                               variants and their aliases are tagged there)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
agent_dir="$repo/dispatcher/sandbox/agent"

BASE_REPO="${BASE_REPO:-dispatcher-base}"
SANDBOX_REPO="${SANDBOX_REPO:-dispatcher-sandbox}"
BUSYBOX_IMAGE="${BUSYBOX_IMAGE:-dispatcher-busybox:latest}"
SANDBOX_UID="${SANDBOX_UID:-1000}"
SANDBOX_GID="${SANDBOX_GID:-1000}"

# "URI SUITE" for every enabled deb source of this machine, both formats (deb822 and one-line).
apt_sources() {
  awk 'BEGIN { RS = "" } {
      uris = ""; suites = ""; deb = 0; enabled = 1
      n = split($0, lines, "\n")
      for (i = 1; i <= n; i++) {
        line = lines[i]; sub(/#.*/, "", line)
        if (line ~ /^Types:/ && line ~ /[ \t]deb([ \t]|$)/) deb = 1
        if (line ~ /^Enabled:[ \t]*[Nn]o/) enabled = 0
        if (line ~ /^URIs:/) { sub(/^URIs:[ \t]*/, "", line); uris = line }
        if (line ~ /^Suites:/) { sub(/^Suites:[ \t]*/, "", line); suites = line }
      }
      if (!deb || !enabled) next
      nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
      for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) if (u[i] != "" && s[j] != "") print u[i], s[j]
    }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true
  sed -nE 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+)[[:space:]]+([^[:space:]]+).*/\2 \3/p' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true
}
# The machine's own apt sources are the mirrors it is known to reach: the first Debian archive
# (a source with a plain release suite), and the first source of a -security suite.
apt_mirror() {
  apt_sources | awk '$2 !~ /-(security|updates|backports)$/ && $1 !~ /-security/ { sub(/\/$/, "", $1); print $1; exit }'
}
apt_security_mirror() {
  apt_sources | awk '$2 ~ /-security$/ { sub(/\/$/, "", $1); print $1; exit }'
}
DEBIAN_MIRROR="${DEBIAN_MIRROR:-$(apt_mirror)}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-$(apt_security_mirror)}"
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

# The packages of a variant (packages/<variant>.txt without comments), comma-separated.
packages_of() {
  sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/packages/$1.txt" | grep -v '^$' | paste -sd, -
}

# The base tag of a variant: a hash of its package list, so a changed list is a new base.
base_tag() {
  printf '%s:bookworm-%s-%s' "$BASE_REPO" "$1" "$(packages_of "$1" | sha256sum | cut -c1-12)"
}

# Bring an unpacked root up to date with bookworm-security. Best effort: a machine whose apt sources
# name no security mirror, or one that does not answer, gets a base without (and a warning).
security_updates() {
  local root="$1" ok=0 out
  if [[ -z "$DEBIAN_SECURITY_MIRROR" || "$DEBIAN_SECURITY_MIRROR" == none ]]; then
    log "warning: no bookworm-security source in this machine's apt sources; base has no security updates"
    return 0
  fi
  printf 'deb %s bookworm main\ndeb %s bookworm-security main\n' \
    "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" "$DEBIAN_SECURITY_MIRROR" >"$root/etc/apt/sources.list"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
  mount -t proc proc "$root/proc"
  # apt's download sandbox user cannot write into a root made by debootstrap; root downloads here.
  local apt=(chroot "$root" apt-get -q -o APT::Sandbox::User=root -o Dpkg::Use-Pty=0)
  if out="$("${apt[@]}" update 2>&1)"; then
    if out="$(DEBIAN_FRONTEND=noninteractive "${apt[@]}" -y upgrade 2>&1)"; then
      ok=1
    else
      printf '%s\n' "$out" >&2
    fi
  fi
  umount "$root/proc"
  rm -f "$root/etc/resolv.conf"
  chroot "$root" apt-get clean >/dev/null 2>&1 || true
  if [[ "$ok" == 1 ]]; then
    log "applied bookworm-security updates from $DEBIAN_SECURITY_MIRROR"
  else
    log "warning: $DEBIAN_SECURITY_MIRROR did not answer; base has no security updates"
  fi
}

# Remove an unpacked root; never across a mount that is still there.
remove_root() {
  local root="$1"
  mountpoint -q "$root/proc" 2>/dev/null && umount "$root/proc"
  rm -rf --one-file-system "$root"
}

build_base() {
  local variant="$1" tag packages root
  tag="$(base_tag "$variant")"
  if have_image "$tag" && [[ "${REBUILD_BASE:-0}" != 1 ]]; then
    log "$tag present, skipping debootstrap"
    return
  fi
  command -v debootstrap >/dev/null || apt_install debootstrap \
    || { log "debootstrap is missing (apt-get install debootstrap)"; exit 1; }
  packages="$(packages_of "$variant")"
  root="$(mktemp -d /tmp/dispatcher-rootfs.XXXXXX)"
  # shellcheck disable=SC2064
  trap "remove_root '$root'" EXIT
  log "debootstrap bookworm ($variant: $packages) into $root (a minute or two)"
  debootstrap --variant=minbase --include="$packages" bookworm "$root" ${DEBIAN_MIRROR:+"$DEBIAN_MIRROR"} >/dev/null
  security_updates "$root"
  # Package caches and lists are dead weight in a read-only sandbox.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["/bin/sh"]' - "$tag" >/dev/null
  remove_root "$root"
  trap - EXIT
  log "imported $tag"
  # Bases of older package lists are dead weight (an image still built on one keeps its layers).
  docker images --format '{{.Repository}}:{{.Tag}}' "$BASE_REPO" \
    | grep -E ":bookworm-$variant-[0-9a-f]{12}$" | grep -vx "$tag" | xargs -r docker rmi >/dev/null 2>&1 || true
}

# The agent package's modules, sorted: what agent.pyz is made of.
agent_sources() {
  find "$agent_dir" -maxdepth 1 -name '*.py' | LC_ALL=C sort
}

# pack_agent OUT: the agent package as one zipapp (its __main__.py starts it), without caches.
pack_agent() {
  local out="$1" stage
  [[ -f "$agent_dir/__main__.py" ]] || { log "missing $agent_dir/__main__.py"; exit 1; }
  stage="$(mktemp -d /tmp/dispatcher-agent.XXXXXX)"
  # shellcheck disable=SC2046
  cp $(agent_sources) "$stage/"
  python3 -m zipapp "$stage" -o "$out"
  rm -rf "$stage"
}

# build_sandbox VARIANT ALIAS PREFIX: the agent layer on the variant's base, tagged PREFIX<hash>
# and ALIAS.
build_sandbox() {
  local variant="$1" alias="$2" prefix="$3" base base_id hash tag ctx
  base="$(base_tag "$variant")"
  base_id="$(docker image inspect -f '{{.Id}}' "$base")"
  hash="$( { cat "$here/Dockerfile"; for f in $(agent_sources); do basename "$f"; cat "$f"; done
    echo "$SANDBOX_UID:$SANDBOX_GID:$base_id"; } | sha256sum | cut -c1-16)"
  tag="$SANDBOX_REPO:$prefix$hash"
  if have_image "$tag"; then
    log "$tag present (inputs unchanged)"
  else
    ctx="$(mktemp -d /tmp/dispatcher-ctx.XXXXXX)"
    cp "$here/Dockerfile" "$ctx/"
    pack_agent "$ctx/agent.pyz"
    log "building $tag"
    quiet_build \
      --build-arg "BASE=$base" \
      --build-arg "SANDBOX_UID=$SANDBOX_UID" --build-arg "SANDBOX_GID=$SANDBOX_GID" \
      --label "dispatcher.inputs=$hash" --label "dispatcher.variant=$variant" \
      -t "$tag" "$ctx"
    rm -rf "$ctx"
  fi
  docker tag "$tag" "$SANDBOX_REPO:$alias"
  log "$SANDBOX_REPO:$alias -> $tag"
  # Older content-hash tags are dead weight; one still used by a container simply stays.
  docker images --format '{{.Repository}}:{{.Tag}}' "$SANDBOX_REPO" \
    | grep -E ":$prefix[0-9a-f]{16}$" | grep -vx "$tag" | xargs -r docker rmi >/dev/null 2>&1 || true
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

default() { build_base default; build_sandbox default latest ""; }
minimal() { build_base minimal; build_sandbox minimal minimal minimal-; }

case "${1:-all}" in
  base) build_base default; build_base minimal ;;
  sandbox) default ;;
  minimal) minimal ;;
  busybox) build_busybox ;;
  agent) pack_agent "${2:-agent.pyz}"; log "packed ${2:-agent.pyz}" ;;
  all) default; minimal; build_busybox ;;
  *) echo "usage: $0 [all|base|sandbox|minimal|busybox|agent [OUT]]" >&2; exit 2 ;;
esac
