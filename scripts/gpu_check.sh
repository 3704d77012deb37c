#!/usr/bin/env bash
# GPU readiness check: one command on a machine with an NVIDIA GPU.
#
#   bash scripts/gpu_check.sh            # after scripts/setup.sh (or quickstart.sh)
#
# Run on an NVIDIA H200 and an H100 (torch 2.11.0+cu130; figures in docs/gpu.md, the latest
# summary in benchmarks/results/gpu/).  It needs a CUDA build
# of torch (scripts/setup.sh installs the CPU wheel: on a GPU machine
# install the CUDA wheel of the same torch version first, or set PYTHON to an environment that
# has one), and for step 3 Horovod with NCCL (scripts/build_horovod_gpu.sh builds it).
#
# Steps (each runs even if an earlier one failed; every result goes to a file):
#   1. environment: nvidia-smi, torch/CUDA versions, horovodrun --check-build   -> env.txt
#   2. pytest -m cuda tests/unit/test_cuda.py test_ddp_cuda.py: every CUDA branch, the DDP hook on NCCL     -> pytest_cuda.txt, pytest_cuda.xml
#   3. the optimizer on CUDA with each compressor, horovodrun with NCCL, pytest on every rank
#      (tests/parallel/test_cuda_nccl.py; 2 ranks when there are 2 GPUs, else 1 rank:
#      NCCL refuses two ranks on one GPU; skipped if Horovod has no NCCL)   -> nccl_optimizer.txt
#   4. the compressor size sweep on the GPU
#      (python -m benchmarks.compressors --sweep-only --device cuda)      -> compressors_sweep_cuda.txt, .csv
#   5. the training harness on the GPU: ResNet101/CIFAR-10, VGG16/CIFAR-100 and LSTM/PTB at full
#      size, 40 steps each on random data in the real formats (scripts/make_synthetic_datasets.py),
#      GraVAC (both policies) and Accordion                              -> harness_*.txt, harness/
#   6. what compression costs a training step: ResNet101/CIFAR-10, one rank, plain torch, the dense
#      controller and each static compressor (python -m benchmarks.step_cost compressors --device cuda,
#      about 2.5 minutes on an H100)                                        -> step_cost_cuda.txt
#      and the launches, views, host syncs and host time the optimizer adds to a step over plain
#      torch, ResNet101 and VGG16 at full size (python -m benchmarks.step_cost launches --device cuda)
#                                                                           -> step_launches_cuda.txt
#   summary.txt: one line per step.  The results folder is printed at the end.
#
# Settings (environment): PYTHON (default .venv/bin/python), RESULTS (default
# reports/gpu_check/<UTC time>), GPU_CHECK_TIMEOUT (seconds per step, default 1800),
# GPU_CHECK_SWEEP=0 (skip step 4), GPU_CHECK_HARNESS=0 (skip step 5), GPU_CHECK_STEP_COST=0
# (skip step 6), GPU_CHECK_DRY_RUN=1
# (without a GPU: run every step anyway, to check the script itself; it still exits 1).
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
PYTHON=$(command -v "$PYTHON" || echo "$PYTHON")   # a bare name (python3) is looked up on PATH
HOROVODRUN=${HOROVODRUN:-$(dirname "$PYTHON")/horovodrun}
RESULTS=${RESULTS:-$ROOT/reports/gpu_check/$(date -u +%Y%m%dT%H%M%SZ)}
STEP_TIMEOUT=${GPU_CHECK_TIMEOUT:-1800}
mkdir -p "$RESULTS"
SUMMARY=$RESULTS/summary.txt
: > "$SUMMARY"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }
step() {   # step NAME OUTFILE COMMAND...: run with a timeout, record its status
  local name=$1 out=$2; shift 2
  echo "== $name: $*" | tee "$out"
  timeout --kill-after=30 "$STEP_TIMEOUT" "$@" >> "$out" 2>&1
  local rc=$?
  tail -n 5 "$out"
  if [ $rc -eq 0 ]; then note "PASS  $name (log: $(basename "$out"))"
  else note "FAIL  $name: exit status $rc$([ $rc -eq 124 ] && echo ' (timed out)') (log: $(basename "$out"))"; FAILED=1; fi
  return $rc
}

if [ ! -x "$PYTHON" ]; then
  note "FAIL  no Python at $PYTHON (run scripts/setup.sh first, or set PYTHON=...)"
  echo "results: $RESULTS"; exit 1
fi

# 1. environment -----------------------------------------------------------------------------
{
  echo "date: $(date -u)"; echo "git: $(git rev-parse HEAD 2>/dev/null) $(git status --short 2>/dev/null | wc -l) changed files"
  command -v nvidia-smi >/dev/null && nvidia-smi || echo "nvidia-smi: not found"
  "$PYTHON" - <<'EOF'
import torch
print("torch", torch.__version__, "built with CUDA", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    print(" ", i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
try:
    import horovod.torch as hvd
    print("horovod", __import__("horovod").__version__, "nccl_built", hvd.nccl_built(), "cuda_built",
          hvd.cuda_built(), "mpi_built", hvd.mpi_built(), "gloo_built", hvd.gloo_built())
except Exception as exc:
    print("horovod: cannot import:", exc)
EOF
  [ -x "$HOROVODRUN" ] && "$HOROVODRUN" --check-build
} > "$RESULTS/env.txt" 2>&1
cat "$RESULTS/env.txt"
# One interpreter for the four facts (each import of torch costs seconds): CUDA, GPUs, Horovod, NCCL.
read -r CUDA_OK NGPU HVD NCCL < <("$PYTHON" - 2>/dev/null <<'EOF' || echo "0 0 0 0"
import torch
facts = [int(torch.cuda.is_available()), torch.cuda.device_count()]
try:
    import horovod.torch as h
    facts += [1, int(bool(h.nccl_built()))]
except Exception:
    facts += [0, 0]
print(*facts)
EOF
)
: "${CUDA_OK:=0}" "${NGPU:=0}" "${HVD:=0}" "${NCCL:=0}"
note "INFO  env: cuda available=$CUDA_OK, GPUs=$NGPU, Horovod NCCL=$NCCL (env.txt)"
if [ "$CUDA_OK" != 1 ]; then
  note "FAIL  torch.cuda.is_available() is False: install a CUDA build of torch (and a driver); nothing ran on a GPU"
  if [ "${GPU_CHECK_DRY_RUN:-0}" != 1 ]; then echo "results: $RESULTS"; exit 1; fi
  note "INFO  GPU_CHECK_DRY_RUN=1: running the remaining steps anyway to check this script (CUDA tests skip)"
  FAILED=1
fi

# 2. every CUDA branch ---------------------------------------------------------------------------
step "pytest -m cuda (tests/unit/test_cuda.py)" "$RESULTS/pytest_cuda.txt" \
  "$PYTHON" -m pytest -m cuda -v -rs -p no:cacheprovider tests/unit/test_cuda.py tests/unit/test_ddp_cuda.py --junitxml="$RESULTS/pytest_cuda.xml"

# horovodrun is a console script; where Horovod was installed with pip --target there is
# none on PATH, and its module runs the same launcher.
LAUNCH=("$HOROVODRUN")
[ -x "$HOROVODRUN" ] || LAUNCH=("$PYTHON" -m horovod.runner.launch)
NP=2                     # ranks of the NCCL runs: one per GPU, at most 2
[ "$NGPU" -lt 2 ] && NP=1

# 3. the optimizer under horovodrun with NCCL ---------------------------------------------------------
if [ "$HVD" != 1 ]; then
  note "SKIP  NCCL optimizer run: Horovod is not installed for $PYTHON (the compressor and wire-format tests need no Horovod; the optimizer's do)"
elif [ "$NCCL" != 1 ]; then
  note "SKIP  NCCL optimizer run: Horovod was built without NCCL (hvd.nccl_built() is False); rebuild it with HOROVOD_GPU_OPERATIONS=NCCL"
else
  if [ "$NP" -lt 2 ]; then
    note "INFO  only $NGPU GPU: the NCCL run uses 1 rank (NCCL refuses two ranks on one GPU); the 2-rank run needs 2 GPUs"
  fi
  step "horovodrun -np $NP NCCL optimizer, every compressor (tests/parallel/test_cuda_nccl.py)" "$RESULTS/nccl_optimizer.txt" \
    "${LAUNCH[@]}" -np "$NP" -H "localhost:$NP" --gloo "$PYTHON" -m pytest -v -s -p no:cacheprovider \
    tests/parallel/test_cuda_nccl.py
fi

# 4. the compressor benchmark on the GPU ------------------------------------------------------------
# The size sweep (256K-25M entries, one full bucket included), each compressor against
# exact Top-k (torch.topk on CUDA) on the same tensor and against a streaming pass.
if [ "${GPU_CHECK_SWEEP:-1}" = 0 ]; then
  note "SKIP  compressor benchmark: GPU_CHECK_SWEEP=0"
else
  step "compressor benchmark: python -m benchmarks.compressors --sweep-only --device cuda" "$RESULTS/compressors_sweep_cuda.log" \
    "$PYTHON" -m benchmarks.compressors --sweep-only --device cuda --out "$RESULTS/compressors_sweep_cuda"
fi

# 5. the training harness on the GPU --------------------------------------------------------------
# The paper's three workloads at full size (ResNet101, VGG16, the 1500-wide LSTM), 40 steps each
# on random data written in the real file formats (nothing is downloaded), GraVAC with both
# policies and Accordion: does the harness run on this device with these ranks.
if [ "${GPU_CHECK_HARNESS:-1}" = 0 ]; then
  note "SKIP  training harness: GPU_CHECK_HARNESS=0"
elif [ "$HVD" != 1 ]; then
  note "SKIP  training harness: Horovod is not installed for $PYTHON"
else
  "$PYTHON" scripts/make_synthetic_datasets.py "$RESULTS/data" > /dev/null
  D=$RESULTS/data
  while IFS='|' read -r name args; do
    # shellcheck disable=SC2086  # args is a list of words
    step "training harness on the GPU: $name ($NP rank(s))" "$RESULTS/harness_$name.txt" \
      "${LAUNCH[@]}" -np "$NP" -H "localhost:$NP" --gloo "$PYTHON" -m horovod_gravac.harness.train \
      --device cuda --steps 40 --eval-every 40 --max-eval-batches 2 --log-every 10 \
      --out "$RESULTS/harness/$name" $args
  done <<EOF_RUNS
r101-gravac-dgc|--preset resnet101-cifar10 --data $D/cifar10 --window 10
vgg16-gravac-geometric-redsync|--preset vgg16-cifar100 --data $D/cifar100 --window 10 --policy geometric --compressor redsync
lstm-gravac-dgc|--preset lstm-ptb --data $D/ptb --window 10
r101-accordion-dgc|--preset resnet101-cifar10 --data $D/cifar10 --controller accordion --accordion-interval 10
EOF_RUNS
fi

# 6. what compression costs a training step ----------------------------------------------------
if [ "${GPU_CHECK_STEP_COST:-1}" = 0 ]; then
  note "SKIP  step cost: GPU_CHECK_STEP_COST=0"
elif [ "$HVD" != 1 ]; then
  note "SKIP  step cost: Horovod is not installed for $PYTHON"
else
  # What the optimizer adds to a step in launches, views, syncs and host time (seconds).
  step "step launches: python -m benchmarks.step_cost launches --device cuda" "$RESULTS/step_launches_cuda.txt" \
    "$PYTHON" -m benchmarks.step_cost launches --device cuda --top 8
  step "step cost: python -m benchmarks.step_cost compressors --device cuda" "$RESULTS/step_cost_cuda.txt" \
    "$PYTHON" -m benchmarks.step_cost compressors --device cuda
fi

echo
cat "$SUMMARY"
echo "results: $RESULTS"
exit $FAILED
