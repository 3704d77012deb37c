#!/usr/bin/env bash
# Build Horovod 0.28.1 with NCCL GPU operations against the torch of $PYTHON, on a CUDA machine
# whose toolchain is newer than Horovod 0.28.1 (June 2023) knows.  Used by scripts/gpu_check.sh's
# optimizer steps where Horovod is missing.  docker/Dockerfile does not use it: the image builds
# Horovod with Debian 12's CUDA 11.8 nvcc and g++-11 against torch 2.5.1's CUDA 12.4 wheels, with
# its own C++17 wrapper (docker/cxx17-wrapper.sh; docker/README.md, docs/docker.md).
#
#   bash scripts/build_horovod_gpu.sh [SOURCE]
#
# SOURCE: horovod-0.28.1.tar.gz or its unpacked folder (default: `pip download` it).
# Settings (environment): PYTHON (default python3), TARGET (install with `pip --target TARGET`;
# default: into PYTHON's environment), HOROVOD_BUILD_CUDA_CC_LIST (default: the compute
# capability of GPU 0), JOBS (default: nproc), HOROVOD_NCCL_HOME (default: the NCCL of the
# nvidia-nccl wheel next to torch).  Horovod's setup.py needs cffi importable (without a
# package index, install its wheel first; pip fetches it where there is one).
#
# Measured on an NVIDIA H200 (CUDA 13.0, gcc 13, CMake 4.4, torch 2.11.0+cu130, Python 3.12):
# about two minutes on 16 cores (107 and 113 s in two builds, timed around it).  Stock
# Horovod 0.28.1 fails there in four places, each fixed here:
#   - CMake 4 refuses Gloo's cmake_minimum_required(< 3.5): CMAKE_POLICY_VERSION_MINIMUM=3.5;
#   - torch >= 2.1 headers need C++17 and Horovod passes -std=c++11/14: a compiler wrapper
#     rewrites them (as scripts/setup.sh does), and its CUDA kernels' CMAKE_CUDA_STANDARD 11
#     becomes 17 (CUDA 13's headers);
#   - gcc 13 no longer pulls <string>, <cstdint>, <stdexcept>, ... in transitively, and
#     Horovod's headers relied on it: the wrapper pre-includes them when it compiles;
#   - nvcc 13 dropped the oldest architectures, which Horovod asks for by default: only
#     HOROVOD_BUILD_CUDA_CC_LIST is built.
set -euo pipefail
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
SOURCE=${1:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
say() { echo "[build_horovod_gpu] $*"; }

if [ -z "$SOURCE" ]; then
  "$PYTHON" -m pip download -q --no-deps --no-binary :all: -d "$WORK" horovod==0.28.1
  SOURCE=$(ls "$WORK"/horovod-*.tar.gz)
fi
if [ -f "$SOURCE" ]; then tar xzf "$SOURCE" -C "$WORK"; SRC=$(ls -d "$WORK"/horovod-*/ | head -n1)
else cp -r "$SOURCE" "$WORK/src"; SRC="$WORK/src"; fi
sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$SRC/horovod/common/ops/cuda/CMakeLists.txt"

NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -n1 || true)
[ -n "$NVCC" ] || { echo "no nvcc found (install the CUDA toolkit or put nvcc on PATH)" >&2; exit 1; }
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$("$PYTHON" -c "import torch; print('%d%d' % torch.cuda.get_device_capability(0))")}

if [ -z "${HOROVOD_NCCL_HOME:-}" ]; then   # the NCCL that torch's wheel ships (nvidia-nccl-cu*)
  NCCL_DIR=$("$PYTHON" -c "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0] if s else '')")
  [ -f "$NCCL_DIR/include/nccl.h" ] || { echo "no NCCL headers next to torch; set HOROVOD_NCCL_HOME" >&2; exit 1; }
  LIB=$(ls "$NCCL_DIR"/lib/libnccl.so* | head -n1)
  mkdir -p "$WORK/nccl/include" "$WORK/nccl/lib"
  ln -s "$NCCL_DIR/include/nccl.h" "$WORK/nccl/include/nccl.h"
  ln -s "$LIB" "$WORK/nccl/lib/libnccl.so"   # the wheel ships only libnccl.so.2
  export HOROVOD_NCCL_HOME="$WORK/nccl" HOROVOD_NCCL_LINK=SHARED
fi

cat >"$WORK/cxx17" <<'SH'
#!/usr/bin/env bash
args=()
for a in "$@"; do
  if [ "$a" = "-c" ]; then
    for h in string cstdint stdexcept memory functional limits cstring algorithm; do args+=(-include "$h"); done
    break
  fi
done
for a in "$@"; do
  case "$a" in -std=c++11|-std=c++14) args+=("-std=c++17") ;; *) args+=("$a") ;; esac
done
exec c++ "${args[@]}"
SH
chmod +x "$WORK/cxx17"

say "Horovod from $SOURCE: nvcc $NVCC, sm_$CC_LIST, NCCL $HOROVOD_NCCL_HOME, $JOBS jobs"
PIP_TARGET=()
[ -n "${TARGET:-}" ] && PIP_TARGET=(--target "$TARGET" --upgrade)
env CXX="$WORK/cxx17" CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$JOBS" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_HOME" \
    HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST" \
    "$PYTHON" -m pip install --no-index --no-build-isolation --no-deps --no-cache-dir "${PIP_TARGET[@]}" "$SRC"
say "built; check: $PYTHON -c 'import horovod.torch as h; print(h.nccl_built())'"
