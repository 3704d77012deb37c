#!/usr/bin/env bash
# The multi-node path on one machine: two containers of the image, joined over ssh the way
# two GCP VMs are, and one `horovodrun -H node1:1,node2:1` job across them.
#
#   bash docker/two_containers.sh [command each rank runs]    # default: docker/smoke_ranks.py
#
# What it does, and how it maps to two VMs:
#   1. a throw-away key pair, made inside the image (no ssh-keygen needed on the host), in a
#      temporary folder mounted read-only at /ssh-keys in both containers (on VMs: the folder
#      you copy to each VM);
#   2. two long-running containers, gravac-node1 and gravac-node2, with the host's network
#      (--network host, as on the VMs). Two containers on one machine share that network, so
#      each one's sshd listens on its own loopback address on the image's port 12345
#      (GRAVAC_SSH_LISTEN: node1 = 127.0.0.2, node2 = 127.0.0.3, names in both /etc/hosts);
#      on VMs each sshd listens on the VM's address and the names are the VMs';
#   3. `horovodrun -np 2 -H node1:1,node2:1 --gloo --network-interface lo` in gravac-node1:
#      Horovod sees two remote hosts, checks ssh to both, and starts one rank in each
#      container over ssh (on VMs: --network-interface ens4). Traffic stays on loopback.
#   4. removes both containers and the keys (KEEP=1 leaves the containers running).
# Settings: IMAGE (default horovod_gravac:cuda), ENGINE (docker | podman | auto), TIMEOUT
# (seconds for the job, default 600), NP_PER_NODE (ranks per container, default 1).
# Exit status: the job's.
set -euo pipefail

IMAGE="${IMAGE:-horovod_gravac:cuda}"
ENGINE="${ENGINE:-auto}"
TIMEOUT="${TIMEOUT:-600}"
NP_PER_NODE="${NP_PER_NODE:-1}"
KEEP="${KEEP:-0}"
say() { printf '[two_containers] %s\n' "$*" >&2; }

if [ "$ENGINE" = auto ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker; else ENGINE=podman; fi
fi
if [ "$ENGINE" = podman ]; then
  if [ -z "${CONTAINERS_CONF:-}" ]; then
    CONTAINERS_CONF="${GRAVAC_IMAGE_WORK:-/var/tmp/horovod_gravac-image}/containers.conf"
    mkdir -p "$(dirname "$CONTAINERS_CONF")"
    [ -f "$CONTAINERS_CONF" ] || printf '[containers]\ndefault_ulimits = []\n' >"$CONTAINERS_CONF"
    export CONTAINERS_CONF
  fi
  ENG=(podman --runtime runc --cgroup-manager cgroupfs)
else
  ENG=(docker)
fi

NODES=(node1 node2)
declare -A ADDR=([node1]=127.0.0.2 [node2]=127.0.0.3)
KEYS="$(mktemp -d)"
# shellcheck disable=SC2329  # called by the EXIT trap
cleanup() {
  if [ "$KEEP" != 1 ]; then
    for n in "${NODES[@]}"; do "${ENG[@]}" rm -f "gravac-$n" >/dev/null 2>&1 || true; done
  fi
  rm -rf "$KEYS"
}
trap cleanup EXIT

say "key pair for the containers (made in $IMAGE)"
"${ENG[@]}" run --rm -e GRAVAC_SSHD=0 -v "$KEYS:/out" "$IMAGE" \
  bash -c 'ssh-keygen -q -t ed25519 -N "" -C gravac-demo -f /out/id_ed25519 && cp /out/id_ed25519.pub /out/authorized_keys'

HOSTS=()
for n in "${NODES[@]}"; do HOSTS+=(--add-host "$n:${ADDR[$n]}"); done
for n in "${NODES[@]}"; do
  "${ENG[@]}" rm -f "gravac-$n" >/dev/null 2>&1 || true
  "${ENG[@]}" run -d --name "gravac-$n" --hostname "$n" --network host "${HOSTS[@]}" \
    -v "$KEYS:/ssh-keys:ro" -e GRAVAC_SSH_LISTEN="${ADDR[$n]}" \
    "$IMAGE" sleep infinity >/dev/null
  say "started gravac-$n: sshd on ${ADDR[$n]}:12345"
done
for n in "${NODES[@]}"; do          # wait for both sshd, checked from node1 as horovodrun will
  for _ in $(seq 1 30); do
    "${ENG[@]}" exec gravac-node1 ssh -o BatchMode=yes -o ConnectTimeout=2 "$n" true 2>/dev/null && break
    sleep 1
  done
  # shellcheck disable=SC2016  # expanded on the remote side
  say "ssh node1 -> $n: $("${ENG[@]}" exec gravac-node1 ssh -o BatchMode=yes "$n" 'echo "$(hostname), $(python --version 2>&1), pid 1 = $(cat /proc/1/comm)"')"
done

if [ "$#" -eq 0 ]; then set -- python docker/smoke_ranks.py; fi
H="node1:$NP_PER_NODE,node2:$NP_PER_NODE"
NP=$((2 * NP_PER_NODE))
say "in gravac-node1: horovodrun -np $NP -H $H --gloo --network-interface lo $*"
rc=0
"${ENG[@]}" exec -e OMP_NUM_THREADS=1 gravac-node1 \
  timeout "$TIMEOUT" horovodrun -np "$NP" -H "$H" --gloo --network-interface lo "$@" || rc=$?
say "job exit status: $rc"
exit "$rc"
