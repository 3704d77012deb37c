#!/usr/bin/env bash
# Device call 21 (seventh GPU session): the repository's own GPU check without the harness and
# the step-cost table (scripts/gpu_session.sh run: native kernels, Horovod 0.28.1 with NCCL,
# pytest -m cuda, the NCCL optimizer cases, the compressor size sweep and its side benchmarks),
# then a second round of the size sweep on the same warm machine for a noise estimate.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
say() { echo "[run21] $* [$(( $(date +%s) - T0 )) s]" | tee -a "$OUT/run21.txt"; }
GPU_CHECK_HARNESS=0 GPU_CHECK_STEP_COST=0 GPU_CHECK_TIMEOUT=200 bash scripts/gpu_session.sh run; say "gpu_session run rc=$?"
PYTHONPATH=$PWD timeout 120 python3 -m benchmarks.compressors --sweep-only --device cuda \
    --out "$OUT/gpu_check/compressors_sweep_cuda_2" > "$OUT/gpu_check/compressors_sweep_cuda_2.log" 2>&1
say "second sweep rc=$?"
