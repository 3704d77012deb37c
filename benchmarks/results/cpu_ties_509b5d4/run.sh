#!/usr/bin/env bash
# The CPU side-by-side behind this session's threshold-compressor changes (ties, DGC's uniform
# sample): 509b5d4 ("new") against 855d1fe ("old"), interleaved twice on one 2-core machine.
# Run from the repository root at 509b5d4 after scripts/setup.sh.
set -euo pipefail
OUT=benchmarks/results/cpu_ties_509b5d4
rm -rf /tmp/old && mkdir /tmp/old && git archive 855d1fe | tar -x -C /tmp/old
cp horovod_gravac/_kernels*.so /tmp/old/horovod_gravac/   # the C kernels did not change
for round in 1 2; do
  for tree in new old; do
    dir=$PWD; [ $tree = old ] && dir=/tmp/old
    (cd "$dir" && "$OLDPWD/.venv/bin/python" -m benchmarks.compressors --sweep-only --sizes 1048576,6553600 \
        --compressors topk,dgc,redsync,sidco-exp --no-multilevel --sweep-repeats 5 \
        --csv "$OLDPWD/$OUT/$tree$round.csv" > /dev/null)
  done
done
.venv/bin/python -m benchmarks.sweep_compare --new $OUT/new1.csv,$OUT/new2.csv \
    --old $OUT/old1.csv,$OUT/old2.csv > $OUT/compare.txt
