#!/usr/bin/env bash
# Register gVisor's runsc as a Docker runtime (network none), so `runtime: runsc` sandboxes work.
#
# Installs Debian's runsc package if the binary is missing, merges the runtime into
# /etc/docker/daemon.json (keeping every other setting), and makes the running daemon pick it up
# with SIGHUP: `runtimes` is one of dockerd's live-reloadable options, so no restart is needed.
# Does nothing when the daemon already lists the runtime. Needs root and a running daemon.
set -euo pipefail

RUNTIME="${RUNTIME_NAME:-runsc}"
CONF="${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}"

runtime_listed() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q "\"$RUNTIME\""; }

if runtime_listed; then exit 0; fi

if ! command -v runsc >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq runsc >/dev/null
fi
runsc_path="$(command -v runsc)"

mkdir -p "$(dirname "$CONF")"
# --network=none: sandboxes have no network anyway, and gVisor's netstack then never starts.
python3 - "$CONF" "$RUNTIME" "$runsc_path" <<'PY'
import json, os, sys
conf, name, path = sys.argv[1:4]
data = {}
if os.path.exists(conf) and os.path.getsize(conf) > 0:
    with open(conf) as f:
        data = json.load(f)
data.setdefault("runtimes", {})[name] = {"path": path, "runtimeArgs": ["--network=none"]}
tmp = conf + ".tmp"
with open(tmp, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
os.replace(tmp, conf)
PY

pidfile=/var/run/docker.pid
if [[ -s "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  kill -HUP "$(cat "$pidfile")"
elif command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker; then
  systemctl reload docker || systemctl restart docker
else
  echo "ensure-runsc: no running dockerd found to reload" >&2
  exit 1
fi

for _ in $(seq 1 40); do
  if runtime_listed; then exit 0; fi
  sleep 0.25
done
echo "ensure-runsc: dockerd did not list runtime $RUNTIME after reload; see its log" >&2
exit 1
