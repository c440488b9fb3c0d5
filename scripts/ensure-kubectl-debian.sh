#!/usr/bin/env bash
# Debian's kubectl (package kubernetes-client, 1.20 on bookworm) beside the machine's own, for
# tests/kubernetes/test_kubernetes_kubectl.py: it is the old client that attaches over SPDY only,
# so the stand-in API server is checked against it too (get/list work, attach is refused clearly).
#
# Unpacked, not installed: its /usr/bin/kubectl would clash with the machine image's kubectl
# package. Does nothing when already there or when the package is not in the archive (Debian 13
# has none: the test then fails under DISPATCHER_REQUIRE_DOCKER=1 and says why).
set -euo pipefail

DEST="${KUBECTL_DEBIAN_DIR:-/opt/kubectl-debian}"
if [ -x "$DEST/usr/bin/kubectl" ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then exit 0; fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
chmod 0777 "$work"  # apt-get download drops privileges to _apt where it can
if ! apt-get download -qq kubernetes-client >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  apt-get download -qq kubernetes-client >/dev/null 2>&1 || { echo "no kubernetes-client package in the archive" >&2; exit 0; }
fi
mkdir -p "$DEST"
dpkg-deb -x kubernetes-client_*.deb "$DEST"
