#!/usr/bin/env bash
# Build the horovod_gravac image from docker/Dockerfile, then print what is inside it.
#
#   bash scripts/build_image.sh [extra build arguments, e.g. --no-cache or --build-arg K=V]
#
# Engine: `docker` when a Docker engine answers (`docker info`), else `podman` with the
# settings that work on a machine without a Docker engine or registry access:
#   - as root, `apt-get install podman debootstrap runc` when they are missing;
#   - the base image debian:bookworm, when no such image is present and it cannot be pulled,
#     is made locally: `debootstrap --variant=minbase bookworm` (Debian's archive only),
#     imported with `podman import` under that tag;
#   - `podman build --isolation chroot --format docker`; containers run with `--runtime runc
#     --cgroup-manager cgroupfs` and a containers.conf (CONTAINERS_CONF) whose [containers]
#     has `default_ulimits = []` (crun fails on rlimits and hybrid cgroups there).
# Idempotent: a second run reuses the base image and the engine's layer cache, rebuilds
# only what changed, and prints the summary again.
#
# Settings (environment):
#   IMAGE        tag to build (default horovod_gravac:cuda)
#   BASE_IMAGE   the Dockerfile's base (default debian:bookworm)
#   ENGINE       docker | podman | auto (default auto)
#   BUILD_JOBS   parallel compile jobs for Horovod (default: nproc)
#   NICE         1 (default): run the build under `nice -n 19 ionice -c3`; 0: as is
#   GRAVAC_CA_BUNDLE  CA bundle for pip inside the build (default: pip's own, if it has one)
#   GRAVAC_IMAGE_WORK  folder for the debootstrap root file system, containers.conf, the build
#                log and the summary (default /var/tmp/horovod_gravac-image)
# Prints: the build time, the image size, Python, torch (CUDA version, arch list), Horovod's
# `horovodrun --check-build`, horovod_gravac's version; the same lines go to
# $GRAVAC_IMAGE_WORK/summary.txt.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-horovod_gravac:cuda}"
BASE_IMAGE="${BASE_IMAGE:-debian:bookworm}"
ENGINE="${ENGINE:-auto}"
BUILD_JOBS="${BUILD_JOBS:-$(nproc)}"
NICE="${NICE:-1}"
WORK="${GRAVAC_IMAGE_WORK:-/var/tmp/horovod_gravac-image}"

say() { printf '[build_image] %s\n' "$*" >&2; }
die() { printf '[build_image] ERROR: %s\n' "$*" >&2; exit 1; }

LOW=()
if [ "$NICE" = 1 ]; then
  command -v ionice >/dev/null && LOW=(nice -n 19 ionice -c3) || LOW=(nice -n 19)
fi
mkdir -p "$WORK"

# --- engine ------------------------------------------------------------------------
if [ "$ENGINE" = auto ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then ENGINE=docker; else ENGINE=podman; fi
fi

apt_install() {
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "missing: $*; install them (Debian/Ubuntu: apt-get install $*) and run again"
  fi
  say "installing $* with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  "${LOW[@]}" apt-get update -qq
  "${LOW[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

case "$ENGINE" in
  docker)
    ENG=(docker)
    BUILD=(docker build)
    ;;
  podman)
    missing=()
    for tool in podman runc; do command -v "$tool" >/dev/null || missing+=("$tool"); done
    [ "${#missing[@]}" = 0 ] || apt_install "${missing[@]}"
    if [ -z "${CONTAINERS_CONF:-}" ]; then
      export CONTAINERS_CONF="$WORK/containers.conf"
      printf '[containers]\ndefault_ulimits = []\n' >"$CONTAINERS_CONF"
    fi
    ENG=(podman --runtime runc --cgroup-manager cgroupfs)
    # --format docker: the OCI format has no SHELL, and the Dockerfile's RUNs rely on bash -o pipefail.
    BUILD=("${ENG[@]}" build --isolation chroot --format docker)
    ;;
  *) die "ENGINE must be docker, podman or auto, not '$ENGINE'" ;;
esac
say "engine: ${ENG[*]}"

# --- base image --------------------------------------------------------------------
base_present() {
  if [ "$ENGINE" = podman ]; then podman image exists "$BASE_IMAGE"
  else docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; fi
}

debootstrap_bookworm() {
  command -v debootstrap >/dev/null || apt_install debootstrap
  local rootfs="$WORK/rootfs-bookworm"
  rm -rf "$rootfs"
  say "no $BASE_IMAGE image and none could be pulled: debootstrap --variant=minbase bookworm"
  "${LOW[@]}" debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian \
    >"$WORK/debootstrap.log" 2>&1 || { tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  # The sources of the public debian:bookworm image (main, updates, security), deb822 style.
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb
  tar -C "$rootfs" -c . | "${ENG[@]}" import --change 'CMD ["bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  say "imported the debootstrapped root file system as $BASE_IMAGE"
}

if ! base_present; then
  say "pulling $BASE_IMAGE"
  if ! timeout 600 "${ENG[@]}" pull "$BASE_IMAGE" >"$WORK/pull.log" 2>&1; then
    [ "$BASE_IMAGE" = debian:bookworm ] || die "cannot pull $BASE_IMAGE (log: $WORK/pull.log)"
    debootstrap_bookworm
  fi
fi

# --- build -------------------------------------------------------------------------
# A CA bundle for networks that intercept TLS: GRAVAC_CA_BUNDLE, else pip's own (PIP_CERT or
# `pip config get global.cert`). It reaches the Dockerfile's pip steps as the build secret
# gravac_ca, mounted for those steps only, never stored in the image.
CA="${GRAVAC_CA_BUNDLE:-${PIP_CERT:-}}"
if [ -z "$CA" ] && command -v pip3 >/dev/null; then CA="$(pip3 config get global.cert 2>/dev/null || true)"; fi
SECRET=()
if [ -n "$CA" ] && [ -f "$CA" ]; then
  SECRET=(--secret "id=gravac_ca,src=$CA")
  say "pip inside the build trusts $CA (build secret gravac_ca)"
fi
LOG="$WORK/build.log"
say "building $IMAGE from docker/Dockerfile on $BASE_IMAGE ($BUILD_JOBS jobs; log: $LOG)"
start=$SECONDS
if ! "${LOW[@]}" "${BUILD[@]}" -f "$ROOT/docker/Dockerfile" -t "$IMAGE" \
      --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "BUILD_JOBS=$BUILD_JOBS" "${SECRET[@]}" "$@" "$ROOT" \
      >"$LOG" 2>&1; then
  tail -n 40 "$LOG" >&2
  die "build failed after $((SECONDS - start)) s (full log: $LOG)"
fi
elapsed=$((SECONDS - start))

# --- what is inside ----------------------------------------------------------------
size=$("${ENG[@]}" image inspect --format '{{.Size}}' "$IMAGE")
{
  echo "image:        $IMAGE ($ENGINE), base $BASE_IMAGE"
  echo "build time:   ${elapsed} s ($(nproc) cores, layer cache as found)"
  echo "image size:   $size bytes ($(awk -v s="$size" 'BEGIN { printf "%.2f GB", s / 1e9 }'))"
  # shellcheck disable=SC2016  # expanded by the container's bash
  "${ENG[@]}" run --rm -e GRAVAC_SSHD=0 "$IMAGE" bash -c '
    set -e
    echo "python:       $(python --version 2>&1)"
    python - <<PY
import torch
print("torch:        %s (CUDA %s, cuDNN %s)" % (torch.__version__, torch.version.cuda, torch.backends.cudnn.version()))
print("arch flags:   %s" % torch._C._cuda_getArchFlags())
print("get_arch_list(): %s (empty without a GPU: torch lists it only where CUDA is available)" % torch.cuda.get_arch_list())
import horovod, horovod.torch as hvd
print("horovod:      %s (nccl_built=%s, gloo_built=%s, mpi_built=%s)" % (horovod.__version__, hvd.nccl_built(), hvd.gloo_built(), hvd.mpi_built()))
import importlib.metadata as md, horovod_gravac
from horovod_gravac import native
print("horovod_gravac: %s (native kernels: %s)" % (md.version("horovod_gravac"), native.mode()))
PY
    echo "horovodrun --check-build:"
    horovodrun --check-build | sed "s/^/  /"
  '
} | tee "$WORK/summary.txt"
