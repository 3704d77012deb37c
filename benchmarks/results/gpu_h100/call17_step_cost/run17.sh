#!/usr/bin/env bash
# Device call 17: what compression costs per step on a GPU. ResNet101/CIFAR-10 (batch 32), one
# rank: plain torch (no distributed optimizer) against the harness with the dense controller
# and static compressors. Results are written to $OUT as they come.
set -u
export PYTHONUNBUFFERED=1
PY=python3; R=$OUT; t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s]"; }
git log --oneline -1 > $R/git.txt
$PY setup.py build_ext --inplace > /tmp/build_ext.log 2>&1; echo "build_ext rc=$? $(el)"
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/cffi-*.whl .whl/pycparser-*.whl
export PYTHONPATH=/tmp/site:$PWD
PYTHON=$PY TARGET=/tmp/site timeout 200 bash scripts/build_horovod_gpu.sh .whl/horovod-0.28.1.tar.gz > /tmp/build_horovod_gpu.log 2>&1
echo "horovod build rc=$? $(el)"
$PY scripts/make_synthetic_datasets.py /tmp/data > /dev/null
timeout 60 $PY .dev/plain_step.py 2>&1 | tee $R/plain_step.txt; echo "plain rc=$? $(el)"
H=/tmp/h; mkdir -p $H
while IFS='|' read -r name args; do
  timeout 60 $PY -m horovod_gravac.harness.train --preset resnet101-cifar10 --data /tmp/data/cifar10 \
    --device cuda --steps 40 --eval-every 1000 --max-eval-batches 1 --log-every 40 --out $H/$name $args \
    > $H/$name.log 2>&1
  echo "$name rc=$? $(el)"; tail -n 1 $H/$name.log | cut -c1-150
  $PY .dev/step_summary.py $H/* > $R/step_summary.txt 2>&1
done <<EOF_RUNS
dense|--controller dense
static-topk-10|--controller static --compressor topk --cf 10
static-dgc-10|--controller static --compressor dgc --cf 10
static-randomk-10|--controller static --compressor randomk --cf 10
static-redsync-100|--controller static --compressor redsync --cf 100
static-sidco-100|--controller static --compressor sidco --cf 100
EOF_RUNS
cat $R/step_summary.txt
tar czf $R/runs.tgz -C $H .
echo "done $(el)"
