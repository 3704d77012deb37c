#!/usr/bin/env bash
# The size sweep at CFs between 10, 100 and 1000 (what GraVAC's ladders also visit), on Laplace
# data and captured gradients, for this tree and for e8500d0 (before this round's SIDCo changes),
# alternated twice.  Run from the repository root; writes the CSVs and compare.txt here.
set -euo pipefail
HERE=benchmarks/results/cpu_midcf_096f7d9
OLD=$(mktemp -d)
git archive e8500d0 | tar -x -C "$OLD"
cp horovod_gravac/_kernels*.so "$OLD/horovod_gravac/"
cp benchmarks/compressors.py "$OLD/benchmarks/"   # this benchmark (--sweep-input), timing that tree's code
for round in 1 2; do
  for input in laplace real; do
    (cd "$OLD" && PYTHONPATH=. "$OLDPWD/.venv/bin/python" -m benchmarks.compressors --sweep-only \
        --sweep-input "$input" --sizes 1048576,6553600 --cfs 15,20,50 --compressors dgc,redsync,sidco-exp,sidco-gamma \
        --csv "$OLDPWD/$HERE/old_${input}_$round.csv" > /dev/null)
    .venv/bin/python -m benchmarks.compressors --sweep-only --sweep-input "$input" --sizes 1048576,6553600 \
        --cfs 15,20,50 --compressors dgc,redsync,sidco-exp,sidco-gamma --csv "$HERE/new_${input}_$round.csv" > /dev/null
  done
done
for input in laplace real; do
  echo "# $input"
  .venv/bin/python -m benchmarks.sweep_compare --new "$HERE/new_${input}_1.csv,$HERE/new_${input}_2.csv" \
      --old "$HERE/old_${input}_1.csv,$HERE/old_${input}_2.csv"
done > "$HERE/compare.txt"
rm -rf "$OLD"
