#!/usr/bin/env bash
# Make a Docker engine answer on this machine: install Debian's docker.io if dockerd is missing,
# start it (no bridge, no iptables: sandboxes use network none) only if no daemon answers.
set -euo pipefail
if docker info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq docker.io >/dev/null
fi
mkdir -p /var/log
nohup dockerd --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
  >/var/log/dispatcher-dockerd.log 2>&1 &
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then exit 0; fi
  sleep 0.5
done
echo "dockerd did not answer within 30 s; see /var/log/dispatcher-dockerd.log" >&2
exit 1
