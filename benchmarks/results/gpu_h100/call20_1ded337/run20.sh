#!/usr/bin/env bash
# Device call 20 (H100): the lean RedSync and SIDCo device paths against bb140a4 (.oldtree/):
# two interleaved rounds of the size sweep each, the per-operation traces, pytest -m cuda
# (the tests that need no Horovod).
set -u
export PYTHONUNBUFFERED=1
PY=python3; R=/tmp/r; mkdir -p $R; T0=$(date +%s)
say() { echo "$* [$(( $(date +%s) - T0 )) s]" | tee -a $R/summary.txt; }
trap 'cp $R/summary.txt $OUT/; tar czf $OUT/call20.tgz -C /tmp r' EXIT
{ date -u; git log --oneline -1; git status --short | head; nvidia-smi -L; } > $R/env.txt 2>&1
$PY setup.py build_ext --inplace > $R/build_ext.log 2>&1; say "build_ext rc=$?"
(cd .oldtree && $PY setup.py build_ext --inplace > $R/build_ext_old.log 2>&1); say "old build_ext rc=$?"
export PYTHONPATH=$PWD
timeout 100 $PY -m pytest -v -p no:cacheprovider -m cuda tests/test_cuda.py -s > $R/pytest_cuda.txt 2>&1; say "pytest cuda rc=$?"
tail -n 1 $R/pytest_cuda.txt >> $R/summary.txt
for round in 1 2; do
  timeout 100 $PY -m benchmarks.compressors --sweep-only --device cuda --out $R/sweep_new_$round > $R/sweep_new_$round.log 2>&1; say "sweep new $round rc=$?"
  (cd .oldtree && PYTHONPATH=$PWD timeout 100 $PY -m benchmarks.compressors --sweep-only --device cuda --out $R/sweep_old_$round > $R/sweep_old_$round.log 2>&1); say "sweep old $round rc=$?"
done
T="--trace topk:100:1048576 --trace dgc:100:1048576 --trace redsync:100:1048576 --trace redsync:1000:262144 --trace redsync:10:6553600 --trace sidco-exp:100:1048576 --trace sidco-exp:1000:6553600 --trace sidco-exp:10:1048576"
timeout 100 $PY -m benchmarks.device_primitives --device cuda --sizes 1048576 $T > $R/primitives_new.txt 2>&1; say "primitives rc=$?"
