#!/usr/bin/env bash
# A GPU check on a lent machine that has a CUDA build of torch but no package index, as two
# commands.
#
#   bash scripts/gpu_session.sh prepare          # here, with a package index: fills .whl/
#   bash scripts/gpu_session.sh run              # there, from the repository root (.whl/ carried)
#
# prepare: downloads what the bare machine cannot, into .whl/ (git-ignored, so carry it
#   explicitly): the Horovod 0.28.1 source archive and the cffi and pycparser wheels for
#   the machine's Python (GPU_PYTHON_VERSION, default 3.12: the H100 and H200 images had
#   torch 2.11.0+cu130 on Python 3.12).  About 4 MB.
# run: builds the native CPU kernels, installs cffi and pycparser into a scratch target,
#   builds Horovod with NCCL there (scripts/build_horovod_gpu.sh, 94-149 s on an H100) and runs
#   scripts/gpu_check.sh with PYTHON=python3 (a GPU machine's torch is system-wide).  When OUT
#   is set (the device tool's output folder, which sends back only a few files) the results
#   are written to a scratch folder and packed, on any exit, into $OUT/gpu_check.tgz (one
#   folder, gpu_check/) with a copy of summary.txt as $OUT/gpu_check_summary.txt; otherwise
#   they go to reports/gpu_check/<UTC time>.  The build log and the git state go next to them.  The
#   gpu_check settings pass through (GPU_CHECK_TIMEOUT, GPU_CHECK_SWEEP=0,
#   GPU_CHECK_HARNESS=0, GPU_CHECK_STEP_COST=0).  The full check takes about 400 s after the
#   build on an H100; under a 600 s limit per command, skip the harness (GPU_CHECK_HARNESS=0)
#   or run the step-cost table in a second call (GPU_CHECK_SKIP_BUILD=1 reuses the build
#   while the machine is still warm).
# ddp: the DDP hook with NCCL on one rank: pytest -m cuda tests/unit/test_ddp_cuda.py, then its
#   step cost (python -m benchmarks.step_cost ddp --device cuda: ResNet-50, every
#   configuration against DDP's default hook).  Needs neither Horovod nor .whl/; writes
#   pytest_ddp_cuda.txt and ddp_step_cost_cuda.txt to $OUT (or reports/gpu_check/).  About a
#   minute on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=${GPU_CARRY:-.whl}
say() { echo "[gpu_session] $*"; }

prepare() {
  local py=${PYTHON:-python3} ver=${GPU_PYTHON_VERSION:-3.12}
  mkdir -p "$CARRY"
  "$py" -m pip download -q --no-deps --no-binary :all: -d "$CARRY" horovod==0.28.1
  "$py" -m pip download -q --no-deps --only-binary :all: --python-version "$ver" \
      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$CARRY" cffi pycparser
  ls -l "$CARRY"
  say "carry $CARRY/ to the GPU machine (it is git-ignored), then: bash scripts/gpu_session.sh run"
}

run() {
  local py=${PYTHON:-python3} site=${GPU_SITE:-/tmp/gpu_site}
  local results
  if [ -n "${OUT:-}" ]; then
    # The device tool returns a handful of files (seven of the check's twenty came back in
    # call 21): one archive carries them all, packed even when a timeout ends the run.
    local scratch
    scratch=$(mktemp -d); mkdir -p "$OUT"
    results=$scratch/gpu_check
    trap 'tar czf "$OUT/gpu_check.tgz" -C "'"$scratch"'" gpu_check; cp -f "'"$results"'/summary.txt" "$OUT/gpu_check_summary.txt" 2>/dev/null || true' EXIT
    trap 'exit 143' TERM
  else
    results=reports/gpu_check/$(date -u +%Y%m%dT%H%M%SZ)
  fi
  mkdir -p "$results"
  { date -u; git rev-parse HEAD 2>/dev/null || true; git status --short 2>/dev/null | head -n 20 || true; } \
      > "$results/git.txt"
  local src
  src=$(ls "$CARRY"/horovod-0.28.1.tar.gz 2>/dev/null || true)
  [ -n "$src" ] || { echo "no $CARRY/horovod-0.28.1.tar.gz: run 'bash scripts/gpu_session.sh prepare' where pip has an index, and carry $CARRY/" >&2; exit 2; }
  "$py" setup.py build_ext --inplace > "$results/build_ext.log" 2>&1 || say "build_ext failed (the NumPy paths run instead): $results/build_ext.log"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  if [ "${GPU_CHECK_SKIP_BUILD:-0}" != 1 ] || ! "$py" -c "import horovod.torch" 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --target "$site" "$CARRY"/cffi-*.whl "$CARRY"/pycparser-*.whl \
        || say "cffi and pycparser did not install for this Python (GPU_PYTHON_VERSION at prepare?)"
    local t0=$SECONDS
    PYTHON=$py TARGET=$site bash scripts/build_horovod_gpu.sh "$src" > "$results/build_horovod_gpu.log" 2>&1 \
        || say "Horovod build failed (the optimizer steps will report it): $results/build_horovod_gpu.log"
    say "Horovod build: $((SECONDS - t0)) s"
  fi
  local rc=0
  PYTHON=$py HOROVODRUN=$site/bin/horovodrun RESULTS=$results bash scripts/gpu_check.sh || rc=$?
  say "results: $results (gpu_check exit $rc)"
  return $rc
}

ddp() {
  local py=${PYTHON:-python3} dir=${OUT:-reports/gpu_check/ddp-$(date -u +%Y%m%dT%H%M%SZ)}
  mkdir -p "$dir"
  "$py" setup.py build_ext --inplace > "$dir/build_ext.log" 2>&1 || say "build_ext failed (the NumPy paths run instead)"
  { "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; } > "$dir/ddp_env.txt" 2>&1
  local rc=0
  "$py" -m pytest -m cuda -v -rs -p no:cacheprovider tests/unit/test_ddp_cuda.py > "$dir/pytest_ddp_cuda.txt" 2>&1 || rc=$?
  tail -n 3 "$dir/pytest_ddp_cuda.txt"
  "$py" -m benchmarks.step_cost ddp --device cuda --out "$dir/ddp_step_cost_cuda.txt" || rc=$?
  return $rc
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  ddp) ddp ;;
  *) echo "usage: bash scripts/gpu_session.sh prepare|run|ddp  (see the comments at the top)" >&2; exit 2 ;;
esac
