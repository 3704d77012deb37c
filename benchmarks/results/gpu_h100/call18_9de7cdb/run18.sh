#!/usr/bin/env bash
# Device call 18 (H100): the one-copy RedSync and SIDCo device paths (9de7cdb) against the
# code before them (bb140a4, carried in .oldtree/), two interleaved rounds of the compressor
# size sweep each; pytest -m cuda; Random-k's device draw; then Horovod with NCCL and the
# per-step cost on ResNet101.  Everything goes to /tmp/r, packed into $OUT/call18.tgz.
set -u
export PYTHONUNBUFFERED=1
PY=python3; R=/tmp/r; mkdir -p $R; T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s]"; }
left() { echo $(( ${BUDGET:-530} - ($(date +%s) - T0) )); }
say() { echo "$* $(el)" | tee -a $R/summary.txt; }
pack() { cp $R/summary.txt $OUT/ 2>/dev/null; tar czf $OUT/call18.tgz -C /tmp r; }
trap pack EXIT
{ date -u; git log --oneline -1; git status --short | head; nvidia-smi -L; $PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"; nproc; } > $R/env.txt 2>&1
$PY setup.py build_ext --inplace > $R/build_ext.log 2>&1; say "build_ext rc=$?"
(cd .oldtree && $PY setup.py build_ext --inplace > $R/build_ext_old.log 2>&1); say "old build_ext rc=$?"
export PYTHONPATH=$PWD
timeout 150 $PY -m pytest -v -p no:cacheprovider -m cuda tests/test_cuda.py -s > $R/pytest_cuda.txt 2>&1; say "pytest cuda rc=$?"
tail -n 2 $R/pytest_cuda.txt >> $R/summary.txt
for round in 1 2; do
  timeout 100 $PY -m benchmarks.compressors --sweep-only --device cuda --out $R/sweep_new_$round > $R/sweep_new_$round.log 2>&1; say "sweep new $round rc=$?"
  (cd .oldtree && PYTHONPATH=$PWD timeout 100 $PY -m benchmarks.compressors --sweep-only --device cuda --out $R/sweep_old_$round > $R/sweep_old_$round.log 2>&1); say "sweep old $round rc=$?"
done
timeout 60 $PY -m benchmarks.randomk_draw --device cuda > $R/randomk_draw_cuda.txt 2>&1; say "randomk_draw rc=$?"
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/cffi-*.whl .whl/pycparser-*.whl
export PYTHONPATH=/tmp/site:$PWD
PYTHON=$PY TARGET=/tmp/site timeout 220 bash scripts/build_horovod_gpu.sh .whl/horovod-0.28.1.tar.gz > $R/build_horovod_gpu.log 2>&1; say "horovod build rc=$?"
timeout 90 $PY -m pytest -v -p no:cacheprovider -m cuda tests/test_cuda.py -k optimizer > $R/pytest_cuda_optimizer.txt 2>&1; say "pytest cuda optimizer rc=$?"
tail -n 2 $R/pytest_cuda_optimizer.txt >> $R/summary.txt
L=$(left); say "step cost with ${L} s left"
[ "$L" -gt 40 ] && timeout "$L" $PY -m benchmarks.step_cost --device cuda --steps 30 \
  --runs dense,topk-10,dgc-10,randomk-10,redsync-100,sidco-100,gravac-dgc --timeout 60 \
  --out $R/step_cost_cuda.txt > $R/step_cost.log 2>&1; say "step cost rc=$?"
