#!/usr/bin/env bash
# Set up horovod_gravac on a fresh Debian/Ubuntu machine: a virtual environment at
# .venv, torch, Horovod 0.28.1 built from source (Gloo + MPI) against that torch,
# mpi4py, the test/report tools, PyTorch Lightning and Accelerate, and this package.
# Idempotent: a second run only checks. Horovod's wheel is cached under ~/.cache/horovod_gravac keyed on the
# Python, torch and Horovod versions (pip's own cache does not know which torch a
# wheel was built against, and a wheel reused after torch changed fails at import).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
VENV="$ROOT/.venv"
WITH_MPI="${HOROVOD_GRAVAC_WITH_MPI:-1}"   # 0: build Horovod with Gloo only

say() { printf '\n[setup] %s\n' "$*"; }
die() { printf '\n[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# --- build prerequisites -----------------------------------------------------
command -v "$PYTHON" >/dev/null || die "$PYTHON not found. Install Python 3.11 (or set PYTHON=/path/to/python3.11)."
"$PYTHON" -c 'import sys; assert sys.version_info[:2] >= (3, 8)' || die "$PYTHON is older than 3.8."
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || die "$PYTHON lacks venv/ensurepip (Debian: apt-get install python3.11-venv)."
for tool in cmake c++ make; do
  command -v "$tool" >/dev/null || die "'$tool' not found: Horovod is built from source (Debian: apt-get install cmake g++ make)."
done

if [ "$WITH_MPI" = "1" ] && ! command -v mpicxx >/dev/null; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    say "installing Open MPI (openmpi-bin, libopenmpi-dev) for Horovod's MPI controller"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null \
      || die "apt-get could not install openmpi-bin libopenmpi-dev. Install them, or set HOROVOD_GRAVAC_WITH_MPI=0 for a Gloo-only build."
  else
    die "Open MPI not found (mpicxx). As root: apt-get install openmpi-bin libopenmpi-dev; or set HOROVOD_GRAVAC_WITH_MPI=0 for a Gloo-only build."
  fi
fi

# iproute2 (ip, tc): the emulated-network benchmarks put ranks in network namespaces.
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    say "installing iproute2 (ip, tc) for the emulated-network benchmarks"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; } \
      || say "warning: could not install iproute2; benchmarks/netem.py will fall back to plain localhost"
  else
    say "note: 'ip'/'tc' missing; benchmarks/netem.py will fall back to plain localhost ranks"
  fi
fi

# --- virtual environment and Python packages ---------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install --upgrade "pip>=23" wheel "setuptools<70"

say "installing torch==$TORCH_VERSION and Horovod's build requirements"
# setuptools<70: Horovod 0.28.1's setup.py imports pkg_resources-era APIs.
# torch before 2.3 was built against NumPy 1.x: NumPy 2 breaks its tensor <-> array calls.
case "$TORCH_VERSION" in 1.*|2.0.*|2.1.*|2.2.*) NUMPY_SPEC="numpy<2" ;; *) NUMPY_SPEC="numpy" ;; esac
"${PIP[@]}" install "torch==$TORCH_VERSION" "$NUMPY_SPEC" cloudpickle psutil pyyaml packaging cffi
if [ "$WITH_MPI" = "1" ]; then "${PIP[@]}" install mpi4py; fi

# --- Horovod, built against this torch ----------------------------------------
PYVER="$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
CACHE="${HOROVOD_GRAVAC_CACHE:-$HOME/.cache/horovod_gravac}/horovod-$HOROVOD_VERSION-torch-$TORCH_VERSION-$PYVER-mpi$WITH_MPI"
horovod_ok() {
  "$PY" - <<'PY' 2>/dev/null
import horovod.torch as hvd  # fails on a wheel built against another torch
PY
}
if ! horovod_ok; then
  WHEEL="$(ls "$CACHE"/horovod-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$WHEEL" ]; then
    say "building Horovod $HOROVOD_VERSION against torch $TORCH_VERSION (about 8 minutes on 2 cores)"
    # Horovod's CMake forces -std=c++14; torch >= 2.1 headers need C++17.
    WRAP="$(mktemp -d)"
    cat >"$WRAP/cxx17" <<'SH'
#!/usr/bin/env bash
args=()
for a in "$@"; do
  case "$a" in -std=c++11|-std=c++14) args+=("-std=c++17") ;; *) args+=("$a") ;; esac
done
exec c++ "${args[@]}"
SH
    chmod +x "$WRAP/cxx17"
    mkdir -p "$CACHE"
    BUILD_ENV=(CXX="$WRAP/cxx17" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1
               HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
               MAKEFLAGS="-j$(nproc)")
    if [ "$WITH_MPI" = "1" ]; then BUILD_ENV+=(HOROVOD_WITH_MPI=1); else BUILD_ENV+=(HOROVOD_WITHOUT_MPI=1); fi
    LOG="$CACHE/build.log"
    env "${BUILD_ENV[@]}" "$PY" -m pip --disable-pip-version-check wheel --no-build-isolation --no-deps \
        --no-cache-dir -w "$CACHE" "horovod==$HOROVOD_VERSION" >"$LOG" 2>&1 \
      || { tail -n 40 "$LOG" >&2; die "Horovod build failed; full log: $LOG"; }
    WHEEL="$(ls "$CACHE"/horovod-*.whl | head -n1)"
  else
    say "reusing cached Horovod wheel $WHEEL"
  fi
  "${PIP[@]}" install --force-reinstall --no-deps "$WHEEL"
  "${PIP[@]}" install "horovod==$HOROVOD_VERSION"   # its runtime requirements
  horovod_ok || die "Horovod was installed but 'import horovod.torch' fails; delete $CACHE and run again."
fi

# --- this package and its tools ---------------------------------------------
# lightning, accelerate: the DDP hook's integration tests run under both.  torch is pinned
# here so that no requirement of theirs can replace the torch Horovod was built against.
say "installing horovod_gravac (editable) with the horovod, test, report, lightning and accelerate extras"
"${PIP[@]}" install -e ".[horovod,test,report,lightning,accelerate]" "torch==$TORCH_VERSION"   # Horovod is already built above

say "horovodrun --check-build"
"$VENV/bin/horovodrun" --check-build
touch "$VENV/.horovod_gravac_ready"
say "ready: $VENV"
